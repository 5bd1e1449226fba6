"""torchrun's watchdog as the agent serves it (monarch_spmd.payload.timer): the requests torch's
FileTimerClient writes, which timers are expired and with which signal, and the pipe itself.
Real clients (torch.distributed.elastic.timer) and real kills are in tests/lib/test_agent.py."""

from __future__ import annotations

import json
import os
import stat

from monarch_spmd.payload import timer


def request(pid: int, scope: str, expires: float, sig: int = 9) -> timer.TimerRequest:
    return timer.TimerRequest(pid, scope, expires, sig)


def test_requests_as_torch_writes_them():
    line = json.dumps({"version": 1, "pid": 42, "scope_id": "step", "expiration_time": 12.5, "signal": 9})
    assert timer.parse_request(line) == request(42, "step", 12.5, 9)
    assert timer.parse_request("not json") is None and timer.parse_request('{"pid": 1}') is None


def test_expired_timers_per_pid_with_the_earliest_signalled_one():
    t = timer.Timers()
    t.register(request(1, "a", 10.0, 0))  # no signal: never reaped
    t.register(request(1, "b", 11.0, 15))
    t.register(request(1, "c", 12.0, 9))
    t.register(request(2, "a", 50.0))
    t.register(request(3, "x", 5.0, 0))
    assert t.expired(9.0) == []
    assert t.expired(12.0) == [request(1, "b", 11.0, 15)]
    t.register(request(1, "b", -1, 0))  # released
    assert t.expired(12.0) == [request(1, "c", 12.0, 9)]
    t.clear([1])
    assert t.expired(100.0) == [request(2, "a", 50.0)]


def test_the_pipe_is_created_read_without_blocking_and_removed(tmp_path):
    path = str(tmp_path / "watchdog")
    open(path, "w").close()  # a stale file is replaced, as torch's server does
    server = timer.FileTimerServer(path)
    try:
        assert stat.S_ISFIFO(os.stat(path).st_mode)
        server.read()  # nothing yet: returns at once
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # what torch's FileTimerClient does
        os.write(fd, (json.dumps({"version": 1, "pid": 7, "scope_id": "s", "expiration_time": 1.0, "signal": 9}) + "\n").encode())
        os.write(fd, b'{"version": 1, "pid": 8, "scope_id": "s", "expi')  # half a line: kept for later
        os.close(fd)
        server.read()
        assert [r.pid for r in server.timers.expired(2.0)] == [7]
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b'ration_time": 1.5, "signal": 9}\n')
        os.close(fd)
        server.read()
        assert sorted(r.pid for r in server.timers.expired(2.0)) == [7, 8]
    finally:
        server.close()
    assert not os.path.exists(path)


def test_a_fresh_path_in_the_temp_folder_when_none_is_given():
    server = timer.FileTimerServer(None)
    try:
        assert os.path.basename(server.path).startswith("watchdog_timer_")
    finally:
        server.close()
