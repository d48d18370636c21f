"""The README's commands and snippet run as written (a newcomer copies them first)."""

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")


def readme():
    with open(README) as f:
        return f.read()


def test_the_from_python_snippet_runs_as_a_script(tmp_path):
    text = readme()
    snippet = text[text.index("## From Python"):].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "snippet.py").write_text(snippet)
    p = subprocess.run([sys.executable, str(tmp_path / "snippet.py")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("] ok: max|C - ref|") == 3   # the verbose bench: every rank's verdict


def test_the_main_command_runs_and_exits_0():
    # The first command of the README, after its install step: what `gemmar` runs by default, no GPU needed.
    command = re.search(r"\.venv/bin/gemmar (bench [^\n`]+)", readme()).group(1).split()
    p = subprocess.run([sys.executable, "-m", "gemmar.console"] + command, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "PASSED" in p.stdout
