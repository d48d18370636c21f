"""Iris's own test suite on gemmar's ranks, run by Iris's own launcher, and the table of how it went.

    python3 benchmarks/iris_tests.py IRIS_CHECKOUT [--real] [--ranks 2] [--folders tests/unittests ...] [--out DIR]
                                     [--heap_gib 2] [-- PYTEST_ARGS]

IRIS_CHECKOUT is a checkout of Iris (not part of gemmar; e.g. ``git clone https://github.com/ROCm/iris``). For each
folder this runs, from the checkout,

    gemmar run --replace_iris -r RANKS tests/run_tests_distributed.py FOLDER -p iris_tests_plugin ...

against gemmar's Iris stand-in, or with ``--real`` against the checkout's own Iris package (``gemmar run --iris
IRIS_CHECKOUT``: Iris's host, device code, tiles, ccl and ops kernels, on gemmar's ranks and heaps).

Iris's launcher sees torchrun's variables and runs pytest on every rank; ``iris_tests_plugin.py`` (beside this
file) records each case as it ends and keeps the AMD-only files out, with their reason. A case passes when it
passed on every rank. Prints, and writes to DIR/summary.json and DIR/summary.md: a table by folder (passed,
failed, skipped by the test itself, AMD-only, never got a result), the pass rate of the cases that are not
AMD-only, and the causes of the failures (the first line of each, by folder). Each folder's output is in
DIR/<folder>.log.
"""

import argparse
import ast
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from iris_tests_plugin import AS_SYMMETRIC, INTERNAL_TESTS, TOO_LARGE, amd_only_reason  # noqa: E402

OURS = {AS_SYMMETRIC, TOO_LARGE} | {reason for _, reason in INTERNAL_TESTS}   # skips the plugin makes, by reason

FOLDERS = ["tests/unittests", "tests/context", "tests/ccl", "tests/ops", "tests/examples"]
ORDER = {"failed": 3, "error": 3, "skipped": 1, "passed": 0}


def case_outcomes(folder):
    """{nodeid: (outcome, message)} on one rank from the plugin's records (a case's worst phase decides)."""
    outcomes = {}
    for path in sorted(os.listdir(folder)):
        if not path.endswith(".jsonl"):
            continue
        rank = int(path[4:-6])
        with open(os.path.join(folder, path)) as f:
            for line in f:
                record = json.loads(line)
                outcome = record["outcome"]
                if outcome == "failed" and record["when"] != "call":
                    outcome = "error"
                mine = outcomes.setdefault(rank, {})
                old = mine.get(record["nodeid"])
                if old is None or ORDER[outcome] > ORDER[old[0]]:
                    mine[record["nodeid"]] = (outcome, record["message"])
    return outcomes


def collected(folder):
    ids = set()
    for path in os.listdir(folder):
        if path.endswith(".collected"):
            with open(os.path.join(folder, path)) as f:
                ids |= {line.strip() for line in f if line.strip()}
    return ids


def merge(per_rank, ids, ranks):
    """One outcome a case across ranks: failed/error if any rank says so, passed if every rank passed, skipped if
    skipped, "no result" if a rank never reported it."""
    merged = {}
    for nodeid in sorted(ids | {n for mine in per_rank.values() for n in mine}):
        seen = [per_rank.get(r, {}).get(nodeid) for r in range(ranks)]
        bad = [s for s in seen if s is not None and s[0] in ("failed", "error")]
        if bad:
            merged[nodeid] = bad[0]
        elif any(s is None for s in seen):
            merged[nodeid] = ("no result", "never reported by every rank (the run ended first)")
        elif all(s[0] == "passed" for s in seen):
            merged[nodeid] = ("passed", "")
        else:
            merged[nodeid] = next(s for s in seen if s[0] == "skipped")
    return merged


def reported(results):
    """How many cases rank 0 has a result for so far."""
    path = os.path.join(results, "rank0.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len({json.loads(line)["nodeid"] for line in f})


def count_test_functions(path):
    """Test functions in a file we do not run (parametrized cases are not expanded: it is never imported)."""
    try:
        tree = ast.parse(open(path).read())
    except (OSError, SyntaxError):
        return 0
    return sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
               for node in ast.walk(tree))


def cause_of(message):
    """A failure's message with its numbers, tensors and arguments blurred, so that alike failures group."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", message)
    text = re.sub(r"tensor\((?:[^()]|\([^()]*\))*(\)|$)", "tensor(...)", text)   # (a tensor's values, any length)
    text = re.sub(r"(kw)?args=(\([^)]*\)|\{[^}]*\})", lambda m: (m.group(1) or "") + "args=...", text)
    text = re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    return text[:160] or "(no message)"


def run_folder(checkout, folder, ranks, out, timeout, heap_bytes, extra, real=False, max_dim=None, sanitize=False):
    name = folder.strip("/").replace("/", "_")
    results = os.path.join(out, name)
    os.makedirs(results, exist_ok=True)
    for stale in os.listdir(results):
        os.unlink(os.path.join(results, stale))
    env = dict(os.environ, GEMMAR_IRIS_RESULTS=results, GEMMAR_IRIS_REAL="1" if real else "",
               GEMMAR_IRIS_MAX_DIM=str(max_dim or ""),
               PYTHONPATH=os.pathsep.join([HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    which = ["--iris", os.path.abspath(checkout)] if real else ["--replace_iris"]
    command = [sys.executable, "-m", "gemmar", "run", *which, *(["--sanitize"] if sanitize else []), "-r", str(ranks),
               "--timeout", str(timeout),
               "--heap_size", str(heap_bytes),
               "tests/run_tests_distributed.py", folder, "-p", "iris_tests_plugin", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", "-q", "--color=no", *extra]
    log = os.path.join(out, f"{name}.log")
    start = time.monotonic()
    with open(log, "w") as f:
        process = subprocess.Popen(command, cwd=checkout, env=env, stdout=f, stderr=subprocess.STDOUT)
        while process.poll() is None:
            time.sleep(15)
            print(f"  {folder}: {reported(results)} of {len(collected(results)) or '?'} cases reported by rank 0, "
                  f"{time.monotonic() - start:.0f} s", flush=True)
    last = open(log).read().strip().splitlines()[-1:] or [""]
    return process.returncode, time.monotonic() - start, last[0], results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="an Iris checkout (holds tests/run_tests_distributed.py)")
    parser.add_argument("--real", action="store_true",
                        help="run the checkout's own Iris package (gemmar run --iris), not gemmar's stand-in")
    parser.add_argument("--max_dim", type=int, default=None,
                        help="skip cases with a dimension (M, N, K, size, a shape's) over this, each counted with its "
                             "reason (Iris's own kernels at 8192 x 8192 take minutes per case under the interpreter)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sanitize", action="store_true",
                        help="gemmar run --sanitize (cpu ranks): a case that reads past the world or a buffer fails "
                             "with the line, instead of ending its rank by SIGSEGV and the folder with it")
    parser.add_argument("--folders", nargs="+", default=FOLDERS)
    parser.add_argument("--out", default=None, help="where logs and the summary go (default: a new temp folder)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per folder before gemmar run stops it")
    parser.add_argument("--heap_gib", type=float, default=2.0,
                        help="symmetric heap per rank (Iris's tests ask for up to 8 GiB; the largest case, an all-to-all "
                             "of 8192 x 16384 fp32 in and out, needs over 1 GiB)")
    parser.epilog = "More pytest arguments after --, e.g. -- -k get"
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)   # (after --: pytest's own arguments, whatever they are)
    args = parser.parse_args(argv[:cut])
    args.pytest_args = argv[cut + 1:]
    launcher = os.path.join(args.checkout, "tests", "run_tests_distributed.py")
    if not os.path.isfile(launcher):
        parser.error(f"{args.checkout} is not an Iris checkout: it has no tests/run_tests_distributed.py")
    if args.ranks < 1:
        parser.error(f"--ranks {args.ranks}: use 1 or more")
    out = args.out or tempfile.mkdtemp(prefix="iris-tests-")
    os.makedirs(out, exist_ok=True)
    which = "its own Iris package (--real)" if args.real else "gemmar's Iris stand-in"
    print(f"Iris's tests at {args.checkout} on {which}, {args.ranks} ranks, {args.heap_gib:g} GiB heaps, logs in {out}",
          flush=True)

    rows, causes = [], collections.Counter()
    not_run, skipped_cases = collections.Counter(), collections.Counter()   # files' test functions; cases
    for folder in args.folders:
        code, seconds, last, results = run_folder(args.checkout, folder, args.ranks, out, args.timeout,
                                                  int(args.heap_gib * (1 << 30)), args.pytest_args, args.real,
                                                  args.max_dim, args.sanitize)
        merged = merge(case_outcomes(results), collected(results), args.ranks)
        counts = collections.Counter(outcome for outcome, _ in merged.values())
        ours = collections.Counter(m for o, m in merged.values() if o == "skipped" and m in OURS)
        for root, _, files in os.walk(os.path.join(args.checkout, folder)):
            for file in files:
                reason = amd_only_reason(os.path.join(root, file)) if file.endswith(".py") else None
                if reason:
                    not_run[reason] += count_test_functions(os.path.join(root, file))
        skipped_cases.update(ours)
        for nodeid, (outcome, message) in merged.items():
            if outcome in ("failed", "error", "no result"):
                causes[(folder, outcome, cause_of(message))] += 1
        failed = counts["failed"] + counts["error"]
        judged = counts["passed"] + failed + counts["no result"]
        rows.append(dict(folder=folder, passed=counts["passed"], failed=failed, no_result=counts["no result"],
                         skipped_by_test=counts["skipped"] - sum(ours.values()), not_run=sum(ours.values()),
                         seconds=round(seconds), exit=code, ended=last,
                         rate=round(100 * counts["passed"] / judged, 1) if judged else None))
        print(f"{folder}: {counts['passed']} passed, {failed} failed, {counts['no result']} no result, "
              f"{counts['skipped']} skipped in {seconds:.0f} s (exit {code}: {last})", flush=True)

    total = {k: sum(r[k] for r in rows) for k in ("passed", "failed", "no_result", "skipped_by_test", "not_run",
                                                   "seconds")}
    judged = total["passed"] + total["failed"] + total["no_result"]
    lines = ["| folder | passed | failed | no result | skipped by the test itself | skipped: AMD-only or Iris's "
             "internals | pass rate | seconds |", "|---|---|---|---|---|---|---|---|"]
    for r in rows + [dict(total, folder="**all**", rate=round(100 * total["passed"] / judged, 1) if judged else None)]:
        lines.append(f"| {r['folder']} | {r['passed']} | {r['failed']} | {r['no_result']} | {r['skipped_by_test']} "
                     f"| {r['not_run']} | {r['rate']} % | {r['seconds']} |")
    lines += ["", "Pass rate: passed / (passed + failed + no result); the cases skipped by the plugin (below) and by "
              "Iris's own skip conditions are not counted.", "",
              "Not run, with the reason (files: test functions, never imported; cases: skipped by the plugin):", "",
              "| reason | files' test functions | cases |", "|---|---|---|"]
    for reason in sorted(set(not_run) | set(skipped_cases)):
        lines.append(f"| {reason} | {not_run.get(reason, 0)} | {skipped_cases.get(reason, 0)} |")
    lines += ["", "Causes of failure:", "", "| folder | outcome | cause (first line) | cases |", "|---|---|---|---|"]
    lines += [f"| {f} | {o} | {c.replace('|', '/')} | {n} |" for (f, o, c), n in causes.most_common()]
    text = "\n".join(lines)
    print("\n" + text)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(dict(ranks=args.ranks, real=args.real, checkout=os.path.abspath(args.checkout), rows=rows, total=total,
                       not_run_files=dict(not_run), not_run_cases=dict(skipped_cases),
                       causes=[dict(folder=f, outcome=o, cause=c, cases=n) for (f, o, c), n in causes.most_common()]),
                  f, indent=1)
    crashed = [r["folder"] for r in rows if r["no_result"]]
    if crashed:
        print(f"\nSome cases never got a result ({', '.join(crashed)}): a rank ended the run; see its log.")


if __name__ == "__main__":
    main()
