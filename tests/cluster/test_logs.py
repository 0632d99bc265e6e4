"""JSON logs: one parseable object per line, with a UTC timestamp, and the children's lines tagged
with their process name by the relay."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

from interlock.cluster.logs import JsonFormatter, tag_json_line


def test_a_record_is_one_json_object_with_a_utc_timestamp() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("interlock.test_logs")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("worker %s left", "w0", extra={"request_id": "chatcmpl-1"})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (
        first["msg"] == "worker w0 left"
        and first["level"] == "WARNING"
        and first["request_id"] == "chatcmpl-1"
    )
    assert first["ts"].endswith("Z") and first["ts"][10] == "T" and first["logger"] == "interlock.test_logs"
    assert "ValueError: boom" in second["exc"]


def test_the_relay_tags_json_lines_and_leaves_others() -> None:
    tagged = tag_json_line(b'{"msg": "hi"}\n', "worker-0")
    assert tagged is not None and json.loads(tagged) == {"process": "worker-0", "msg": "hi"}
    assert tag_json_line(b"Interlock serving on :8000\n", "worker-0") is None


def test_a_command_logs_json_when_asked() -> None:
    code = (
        "import asyncio, logging\n"
        "from interlock.cluster.runner import run_command\n"
        "async def main():\n"
        "    logging.getLogger('interlock.x').info('ready')\n"
        "    return 0\n"
        "raise SystemExit(run_command('x', main(), log_level='INFO', log_format='json'))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    (line,) = [line for line in run.stderr.splitlines() if line.strip()]
    assert json.loads(line)["msg"] == "ready"


def test_lines_written_while_a_request_is_served_name_it_in_both_formats() -> None:
    from interlock.cluster.logs import TextFormatter
    from interlock.logctx import REQUEST_ID, RequestIdFilter

    for formatter in (JsonFormatter(), TextFormatter()):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        handler.addFilter(RequestIdFilter())
        log = logging.getLogger("interlock.test_logs_ctx")
        log.addHandler(handler)
        log.propagate = False
        try:
            log.warning("before")
            token = REQUEST_ID.set("chatcmpl-7")
            log.warning("during")
            REQUEST_ID.reset(token)
            log.warning("after")
        finally:
            log.removeHandler(handler)
        before, during, after = stream.getvalue().splitlines()
        assert "chatcmpl-7" in during and "chatcmpl-7" not in before + after
        if isinstance(formatter, JsonFormatter):
            assert json.loads(during)["request_id"] == "chatcmpl-7" and "request_id" not in json.loads(after)
        else:
            assert during.endswith(" request_id=chatcmpl-7")


def test_info_lines_go_out_in_batches_and_a_warning_at_once_in_order() -> None:
    import time

    from interlock.cluster.logs import BufferedHandler

    class Counting(io.StringIO):
        writes = 0

        def write(self, s: str) -> int:
            Counting.writes += 1
            return super().write(s)

    stream = Counting()
    handler = BufferedHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("interlock.test_logs_buffered")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        for i in range(50):
            log.info("line %d", i)
        assert Counting.writes == 0  # held: no write per line
        log.warning("careful")  # at once, after the lines before it
        assert Counting.writes == 1
        lines = stream.getvalue().splitlines()
        assert lines[:50] == [f"INFO line {i}" for i in range(50)] and lines[50] == "WARNING careful"
        log.info("late")
        deadline = time.monotonic() + 5
        while "late" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stream.getvalue().endswith("INFO late\n")  # the flusher wrote it within its period
    finally:
        log.removeHandler(handler)


def test_a_library_handler_that_prints_the_pid_formats_every_record() -> None:
    """vLLM's own handler prints ``pid=%(process)d``: after ``configure`` (in a process of its
    own, as a worker does) a record still carries the process and thread ids (a None there made
    every vLLM record a "--- Logging error ---" traceback)."""
    code = (
        "import logging, os\n"
        "from interlock.cluster.logs import configure\n"
        "configure('INFO', 'text')\n"
        "out = []\n"
        "class Keep(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        out.append(self.format(record))\n"
        "h = Keep()\n"
        "h.setFormatter(logging.Formatter('(pid=%(process)d tid=%(thread)d) [%(filename)s:%(lineno)d] %(message)s'))\n"
        "log = logging.getLogger('vllm.config.model')\n"
        "log.addHandler(h)\n"
        "log.propagate = False\n"
        "log.info('Resolved architecture: %s', 'LlamaForCausalLM')\n"
        'assert out == [f\'(pid={os.getpid()} tid={__import__("threading").get_ident()}) [(unknown file):0] '
        "Resolved architecture: LlamaForCausalLM'], out\n"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
