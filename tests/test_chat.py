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
    out, err = proc.communicate(script, timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    answers = [line for line in out.splitlines() if line.strip()]
    assert "Paris" in answers[0]
    assert "Rome" in answers[1]  # the second turn saw the first: "of Italy" alone means nothing
    assert "adapter chat, decoder ss+pld; 2 answers" in err
    assert "5 messages" not in err and "4 messages in the conversation" in err
    assert "available: chat, data2text, sql, summarize" in err
    assert "(adapter sql)" in err and "adapter sql, decoder ss+pld; 2 answers" in err
    assert "error: adapter 'nope' not found" in err
    assert "0 messages in the conversation" in err  # after /reset
    assert err.count("tokens/pass, ") >= 2  # stats after each answer


def test_ctrl_c_stops_the_answer_and_keeps_the_session():
    proc = chat("--max-tokens", "400", "--decoder", "ar")
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
