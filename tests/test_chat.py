"""`specstream chat` driven through stdin as a user would type, on the default model."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def chat(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "specstream_apps.cli", "chat", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_two_turns_adapter_switch_stats_reset_and_eof():
    proc = chat("--max-tokens", "24")
    script = (
        "What is the capital of France?\n"
        "And of Italy?\n"
        "/stats\n"
        "/adapter\n"
        "/adapter sql\n"
        "/adapter nope\n"
        "/stats\n"
        "/reset\n"
        "/stats\n"
    )  # then EOF
    # a hang guard: with a fresh cache the first turn measures the latency curve first (this
    # test took 196 s alone on the slowest dev-cpu instance, where the curve took 179 s before
    # version 7 and 313 s since; its quickstart twin timed out at 600 s beside other work)
    out, err = proc.communicate(script, timeout=1200)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    answers = [line for line in out.splitlines() if line.strip()]
    assert "Paris" in answers[0]
    assert "Rome" in answers[1]  # the second turn saw the first: "of Italy" alone means nothing
    assert "adapter chat, decoder ss+pld; 2 answers" in err
    assert "4 messages in the conversation" in err
    assert "available: chat, data2text, sql, summarize" in err
    assert "(adapter sql)" in err and "adapter sql, decoder ss+pld; 2 answers" in err
    assert "error: adapter 'nope' not found" in err
    assert "0 messages in the conversation" in err  # after /reset
    assert err.count("tokens/pass, ") >= 2  # stats after each answer


def test_ctrl_c_stops_the_answer_and_keeps_the_session():
    # 120 tokens: the answer is still running when it is stopped (about 15 s of decoding on the
    # dev CPU, over 1 s at 100 tokens/s) and the next one, which tends to go on with the
    # story, ends soon (with 400 it decoded all 400: 51 s of this test's 65)
    proc = chat("--max-tokens", "120", "--decoder", "ar")
    proc.stdin.write("Write a long story about a dragon who learns to cook.\n")
    proc.stdin.flush()
    first = proc.stdout.read(20)  # the answer has started
    assert first.strip()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate("/stats\nSay hello.\n/quit\n", timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "(stopped) [" in err
    assert "2 answers" not in err and "1 answers" in err  # /stats after the stopped one
    assert err.count("tokens/s]") == 2  # the stopped answer and the next one


def test_the_oldest_turns_leave_when_the_context_is_full(default_model):
    from dataclasses import replace

    from specstream_apps.chat_cmd import fit_history

    small = replace(default_model, context_length=120)  # room: 120 - 24 = 96 tokens
    turn = "Tell me about the history of the bicycle in a few words please."
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        messages += [{"role": "user", "content": f"{i}: {turn}"},
                     {"role": "assistant", "content": f"{i}: It began in 1817."}]  # fmt: skip
    messages.append({"role": "user", "content": "last question"})
    kept, dropped = fit_history(small, messages, 24)
    assert kept[0] == messages[0] and kept[-1] == messages[-1]
    assert kept[1:] == messages[1 + dropped :] and dropped > 0 and dropped % 2 == 0
    from specstream_mlx.generate import encode_prompt

    assert len(encode_prompt(small, kept)) <= 96
    assert len(encode_prompt(small, [messages[0], *messages[dropped - 1 :]])) > 96  # not too many
    assert fit_history(default_model, messages, 24) == (messages, 0)  # it all fits in 8192
