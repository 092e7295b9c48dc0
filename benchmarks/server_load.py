"""Load on `specstream serve` (issue 6): N concurrent chat-completion requests mixing the four
shipped adapters, on real prompts from ../shared/data, then each request again alone; every
concurrent answer must equal its answer alone (no cross-talk between requests or adapters).

    ./dev.sh python benchmarks/server_load.py [--requests 50] [--max-tokens 48]
        [--data ../shared/data] [--json OUT.json]

The server runs in this process (uvicorn on 127.0.0.1, a free port); the clients are httpx in
threads, all sent at once. Latency = request sent -> whole answer received (queueing included);
throughput = completion tokens / wall time of the concurrent phase.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import uvicorn
from specstream_apps.server import create_app

import specstream_mlx as ss
from specstream_mlx.manager import AdapterManager
from specstream_mlx.provenance import provenance
from specstream_mlx.tasks import read_task_examples
from specstream_mlx.training.chat_prompts import build_chat_mix


def prompts(data: Path, n: int) -> list[tuple[str, str]]:
    """(adapter, user message) for n requests, cycling chat, sql, summarize, data2text."""
    per = n // 4 + 1
    pools = {
        "chat": [p for p, _ in build_chat_mix(data, per, seed=1, split="dev")],
        "sql": [e.prompt for e in read_task_examples("sql", data / "sql/dev.jsonl", per)],
        "summarize": [
            e.prompt for e in read_task_examples("summarize", data / "dialogsum/dev.jsonl", per)
        ],
        "data2text": [e.prompt for e in read_task_examples("data2text", data / "e2e/dev.csv", per)],
    }
    names = list(pools)
    return [(names[i % 4], pools[names[i % 4]][i // 4]) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    manager = AdapterManager(ss.load())
    app = create_app(manager)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    work = prompts(Path(args.data), args.requests)

    def send(item):
        adapter, message = item
        body = {"messages": [{"role": "user", "content": message}], "adapter": adapter,
                "max_tokens": args.max_tokens}  # fmt: skip
        start = time.perf_counter()
        response = httpx.post(url, json=body, timeout=3600)
        response.raise_for_status()
        out = response.json()
        return out, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(args.requests) as pool:
        together = list(pool.map(send, work))
    wall = time.perf_counter() - start
    alone = [send(item) for item in work]
    server.should_exit = True
    app.state.worker.stop()

    def text(out):
        return out["choices"][0]["message"]["content"]

    same = sum(text(a) == text(b) for (a, _), (b, _) in zip(together, alone, strict=True))
    latencies = [t for _, t in together]
    tokens = sum(o["usage"]["completion_tokens"] for o, _ in together)
    per_adapter = {}
    for (adapter, _), (out, _) in zip(work, alone, strict=True):
        spec = out["speculative"]
        entry = per_adapter.setdefault(adapter, {"requests": 0, "tau": []})
        entry["requests"] += 1
        entry["tau"].append(spec["mean_accepted_tokens"])
    result = {
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "identical_to_alone": same,
        "wall_seconds": round(wall, 2),
        "requests_per_second": round(args.requests / wall, 3),
        "completion_tokens_per_second": round(tokens / wall, 2),
        "latency_seconds": {
            "p50": round(float(np.percentile(latencies, 50, method="higher")), 2),
            "p90": round(float(np.percentile(latencies, 90, method="higher")), 2),
            "p99": round(float(np.percentile(latencies, 99, method="higher")), 2),
            "max": round(max(latencies), 2),
        },
        "alone_seconds_median": round(statistics.median(t for _, t in alone), 3),
        "per_adapter": {
            a: {"requests": e["requests"], "mean_tau": round(statistics.mean(e["tau"]), 3)}
            for a, e in per_adapter.items()
        },
        **provenance(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
