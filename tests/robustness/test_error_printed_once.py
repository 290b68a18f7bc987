"""An error a user causes inside a job is shown once: the ``error:`` line on stderr, not also as a
logged ``ERROR`` line on the console (Hydra's console handler prints to stdout); the run's log file
keeps it (issue 25, point 13). A name far from every registered one gets no made-up suggestion
(point 9: ``doesnotexist`` was offered ``boq_resnet50``)."""

from __future__ import annotations

from pathlib import Path

from entry_helpers import error_line, run_entry


def test_an_error_inside_the_job_is_printed_once_and_logged_to_the_file(tmp_path: Path) -> None:
    result = run_entry(["model=doesnotexist.tag"], tmp_path, script="eval.py")
    line = error_line(result)
    message = line.removeprefix("error: ")
    assert message.startswith("model=doesnotexist.tag: unknown model 'doesnotexist'."), line
    assert "Did you mean" not in message
    assert (result.stdout + result.stderr).count(message) == 1, result.stdout + result.stderr
    assert "[ERROR]" not in result.stdout
    (log_file,) = (tmp_path / "logs" / "eval" / "runs").glob("*/eval.log")
    assert f"[ERROR] - {message}" in log_file.read_text()
