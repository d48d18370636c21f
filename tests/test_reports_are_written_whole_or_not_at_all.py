"""A run's report is written whole or not at all: a path that cannot be written (empty, in /proc, another user's
file in a sticky folder) is refused before the run, and a disk that fills during the run keeps the earlier report and
says where the new one is instead, exit 4 (docs/guarantees.md)."""

import os
import subprocess

import pytest

from run_as_user import GEMMAR, needs, needs_mount_namespace

@pytest.mark.parametrize("path, message", [("", "--output_file '' is not a file name"),
                                           ("/proc/version", "/proc/version cannot be written: a new file in /proc")])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(capsys, path, message):
    """--output_file '' wrote nothing and said nothing; /proc/version failed after the run."""
    from gemmar import cli

    assert cli.main(["bench", "-r", "2", "-m", "32", "-n", "32", "-k", "32", "--output_file", path]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert message in line, line


def test_another_users_report_in_a_sticky_folder_is_refused_before_the_run(tmp_path):
    """In /tmp (sticky), a report of another user's cannot be replaced by a rename (nor, with
    fs.protected_regular, opened): refused before the run (uid 65533 against root's file)."""
    import shutil
    import tempfile

    needs("setpriv")
    folder = tempfile.mkdtemp(prefix="gemmar-sticky-", dir="/tmp")   # (tmp_path's parents are root's, 0700)
    try:
        os.chmod(folder, 0o1777)
        theirs = os.path.join(folder, "report.json")
        with open(theirs, "w") as f:
            f.write('{"theirs": true}\n')
        os.chmod(theirs, 0o666)
        caps = "+dac_read_search,+dac_override"
        p = subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", f"--inh-caps={caps}",
                            f"--ambient-caps={caps}", *GEMMAR, "bench", "-r", "2", "--output_file", theirs],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": "/nonexistent"})
        assert p.returncode == 2, p.stderr
        line, = p.stderr.strip().splitlines()
        assert "belongs to another user (uid 0) in the sticky folder" in line, line
        assert open(theirs).read() == '{"theirs": true}\n'
    finally:
        shutil.rmtree(folder)


def test_a_disk_that_fills_during_the_run_keeps_the_earlier_report_and_says_where_the_new_one_is(tmp_path):
    """The report's folder (a 64 KiB tmpfs of its own, in a mount namespace) fills while the run runs: the earlier
    report is left whole, one line says the report was not written and where it is instead (TMPDIR), exit 4."""
    needs_mount_namespace()
    full, out = tmp_path / "full", tmp_path / "out"
    full.mkdir()
    out.mkdir()
    gemmar = " ".join(GEMMAR + ["bench", "-r", "2", "-m", "32", "-n", "32", "-k", "32", "-v", "--output_file",
                                f"{full}/report.json"])
    script = (f"mount -t tmpfs -o size=64k tmpfs {full} && echo '{{\"earlier\": true}}' > {full}/report.json && "
              f"{{ TMPDIR={out} {gemmar} > {out}/stdout 2> {out}/stderr & }} && "
              f"while ! grep -q 'ranks up' {out}/stdout; do sleep 0.1; done; "
              f"head -c 1000000 /dev/zero > {full}/fill 2>/dev/null; wait $!; echo $? > {out}/rc; "
              f"cat {full}/report.json > {out}/earlier")
    subprocess.run(["unshare", "-m", "sh", "-c", script], timeout=180)
    stderr = (out / "stderr").read_text()
    assert (out / "rc").read_text().strip() == "4", stderr
    assert "PASSED" in (out / "stdout").read_text()
    line, = [line for line in stderr.splitlines() if not line.startswith("[gemmar]")]
    assert f"the report was not written to {full}/report.json (No space left on device); an earlier file there " \
           f"is left as it was; it is at {out}/gemmar-" in line, line
    assert (out / "earlier").read_text() == '{"earlier": true}\n'
    copy, = out.glob("gemmar-*-report.json")
    assert '"success": true' in copy.read_text()


def test_a_report_whose_rename_fails_stays_at_its_temporary_name(tmp_path):
    """Where only the rename fails (the path became a folder meanwhile), the line names the temporary file."""
    from gemmar.outputs import write_whole

    (tmp_path / "report.json").mkdir()
    (tmp_path / "report.json" / "inside").write_text("")
    line = write_whole(str(tmp_path / "report.json"), lambda path: open(path, "w").write("{}"))
    kept = line.rsplit("it is at ", 1)[1]
    assert line.startswith(f"the report was not written to {tmp_path}/report.json (") and open(kept).read() == "{}"
