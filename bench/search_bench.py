"""Benchmark of full-text search: build, size, query latency, flush cost, grep.

Not a test: it measures and prints markdown tables (each figure with its
target and PASS/MISS) and writes the figures as JSON to
``bench-results/search.json``.

    .venv/bin/python bench/search_bench.py [--sessions N] [--mb M] [--runs R] [--tmpdir DIR]

1. Generates SESSIONS sessions (default 10,000) holding at least M megabytes
   (default 1024) of session files, deterministically (seeded), from a pool of
   prose, code, tool output and CJK text; streamed replies are logged as
   content chunks, the way the store writes them.  Most sessions are global,
   some belong to projects or actions.
2. Builds the index from nothing (what `magent-store index ROOT --rebuild`
   does) and reports MB/s of session files and of text, and its size.
3. Query latency of common, rare and CJK terms on the open index (p50/p95),
   and of the whole `magent-store search ... --json` command (process start,
   the catch-up check of every session, the query).
4. The users' workaround, `grep -rlF TERM` over the session files, for the
   same terms in the same run: the speed-up factor.
5. Streaming 850 chunks at 131 chunks/s into a new session of the same root,
   flushed every 250 ms as the Emacs shim does, with the index on and off,
   interleaved R times each: the flush time p50/p99 side by side.

The temporary directory (under $TMPDIR unless --tmpdir) is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from magent_store.layout import Scope
from magent_store.parts import default_header
from magent_store.search import SearchIndex, open_index
from magent_store.store import Store

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench-results" / "search.json"
CHUNKS = 850
CHUNKS_PER_S = 131
TICK_S = 0.25
SEED = 14

# Blank-separated, so the lists read as text.
WORDS = str.split(
    "the of and to in is that for it with as was on be by this are from at or an have not which but "
    "function return value error database query index session thread turn item event flush log "
    "snapshot buffer window process server client request response timeout retry config "
    "test build deploy branch commit merge review patch file path line column string number"
)
CJK_WORDS = str.split(
    "数据库 迁移 失败 连接 配置 检查 服务器 文件 路径 错误 日志 测试 部署 版本 分支 提交 合并 代码 函数 "
    "变量 我们 需要 这个 问题 可以 已经 然后 因为 所以 但是 如果 没有 时间 用户 系统 性能 缓存 索引 "
    "查询 接口 返回 参数 调用 线程 进程 内存 网络 请求 响应 超时 重试 日本語 検索 会話 設定"
)
CJK_RARE = "鲸鱼迁徙路线"
IDENT_PARTS = ("parse", "query", "flush", "record", "index", "session", "store", "load", "buffer",
               "handle", "config", "event", "item", "thread", "append", "write", "read", "scan")  # fmt: skip


def _prose(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        n = rng.randint(6, 20)
        sentence = " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def _code(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        name = "_".join(rng.sample(IDENT_PARTS, 2))
        arg = rng.choice(IDENT_PARTS)
        line = rng.choice((
            f"def {name}({arg}: str) -> int:",
            f"    {arg} = self.{name}({arg}, {rng.randint(0, 999)})",
            f"    if not {arg}: raise ValueError(\"{name} failed\")",
            f"    return {name}({arg})  # function {rng.choice(WORDS)}",
            f"(defun magent-{name.replace('_', '-')} ({arg}) \"{rng.choice(WORDS)}.\")",
        ))  # fmt: skip
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _tool(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        path = "/".join(rng.sample(IDENT_PARTS, 3)) + rng.choice((".py", ".el", ".log", ".json"))
        line = rng.choice((
            f"src/{path}:{rng.randint(1, 2000)}: {rng.choice(WORDS)} {rng.choice(WORDS)} error",
            f"{rng.randint(10, 23)}:{rng.randint(10, 59)}:{rng.randint(10, 59)} INFO {rng.choice(WORDS)} "
            f"took {rng.randint(1, 900)} ms",
            f"  File \"/home/dev/{path}\", line {rng.randint(1, 999)}, in {rng.choice(IDENT_PARTS)}",
            f"-rw-r--r-- 1 dev dev {rng.randint(100, 99999)} Nov {rng.randint(1, 30)} {path}",
        ))  # fmt: skip
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _cjk(rng: random.Random, chars: int) -> str:
    return "".join(rng.choice(CJK_WORDS) if rng.random() > 0.1 else "，" for _ in range(chars // 9))


def text_pool(rng: random.Random) -> dict[str, list[str]]:
    makers = {"prose": _prose, "code": _code, "tool": _tool, "cjk": _cjk}
    return {kind: [make(rng, rng.randint(300, 5000)) for _ in range(300)] for kind, make in makers.items()}


def rare_term(n: int) -> str:
    return f"zephyrquux{n:05d}"


def generate(root: Path, sessions: int, target_bytes: int) -> dict[str, Any]:
    """Write SESSIONS sessions of TARGET-BYTES in all; return what was written."""
    rng = random.Random(SEED)
    pool = text_pool(rng)
    per_session = target_bytes / sessions
    projects = [f"/home/dev/src/project-{n}" for n in range(20)]
    total = text = 0
    rare: list[str] = []
    for n in range(sessions):
        sid = f"s{n:05d}"
        kind = rng.random()
        scope = (Scope.global_() if kind < 0.6 else Scope.project(rng.choice(projects)) if kind < 0.95
                 else Scope.action(f"action-{n % 7}"))  # fmt: skip
        directory = scope.directory(root)
        directory.mkdir(parents=True, exist_ok=True)
        header = default_header(sid, scope)
        lines: list[bytes] = []
        clock = 1_750_000_000.0 + n * 600
        seq = 0
        budget = per_session * rng.uniform(0.3, 1.7)
        size = 0

        def event(kind: str, turn: str | None, item: str | None, payload: Any,
                  sid: str = sid, lines: list[bytes] = lines) -> None:  # fmt: skip
            nonlocal seq, clock, size
            seq += 1
            clock += 0.05
            line = orjson.dumps({"seq": seq, "type": kind, "thread-id": f"th-{sid}", "turn-id": turn,
                                 "item-id": item, "payload": payload, "created-at": clock}) + b"\n"  # fmt: skip
            lines.append(line)
            size += len(line)

        event("thread-started", None, None, None)
        t = 0
        while size < budget:
            turn = f"t{t}"
            language = "cjk" if rng.random() < 0.15 else "prose"
            question = rng.choice(pool[language])[: rng.randint(80, 600)]
            if t == 0 and n % 50 == 0:
                question += " " + rare_term(n)
                rare.append(rare_term(n))
            if t == 0 and n % 500 == 7:
                question += CJK_RARE
            event("turn-started", turn, None, {"turn": {"id": turn, "input": question}})
            event("item-started", turn, f"u{t}", {"item": {"id": f"u{t}", "type": "message", "role": "user",
                                                           "content": question}})  # fmt: skip
            text += len(question.encode())
            reply = rng.choice(pool[language]) + "\n" + rng.choice(pool["code"])
            event("item-started", turn, f"a{t}", {"item": {"id": f"a{t}", "type": "message", "role": "assistant"}})
            for start in range(0, len(reply), 600):
                event("item-content-appended", turn, f"a{t}", {"chunk": reply[start:start + 600], "output": False})
            event("item-completed", turn, f"a{t}", {"item": {"id": f"a{t}"}})
            text += len(reply.encode())
            if rng.random() < 0.6:
                output = rng.choice(pool["tool"])
                event("item-started", turn, f"c{t}", {"item": {"id": f"c{t}", "type": "tool", "name": "shell",
                                                               "input": {"command": "grep -rn x ."}}})  # fmt: skip
                for start in range(0, len(output), 2000):
                    event("item-content-appended", turn, f"c{t}",
                          {"chunk": output[start:start + 2000], "output": True})  # fmt: skip
                event("item-completed", turn, f"c{t}", {"item": {"id": f"c{t}"}})
                text += len(output.encode())
            event("turn-completed", turn, None, {"usage": None})
            t += 1
        header["title"] = question[:60]
        head = orjson.dumps(header)
        (directory / f"{sid}.json").write_bytes(head)
        (directory / f"{sid}.jsonl").write_bytes(b"".join(lines))
        total += size + len(head)
        if (n + 1) % 1000 == 0:
            print(f"  generated {n + 1} sessions, {total / 1e6:.0f} MB", file=sys.stderr)
    return {"sessions": sessions, "bytes": total, "text_bytes": text, "rare_terms": rare}


def cpu_all() -> float:
    """CPU seconds of this process and of the children it has waited for (a build's readers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure_queries(root: Path, rare: list[str], repeats: int) -> dict[str, dict[str, float]]:
    index, _ = open_index(root)
    queries = {
        "common (function)": ["function"] * repeats,
        "common, 2 words (database error)": ["database error"] * repeats,
        "rare (zephyrquux…)": [rare[i % len(rare)] for i in range(repeats)],
        "CJK (数据库)": ["数据库"] * repeats,
        f"CJK rare ({CJK_RARE})": [CJK_RARE] * repeats,
        "identifier (parse_query)": ["parse_query"] * repeats,
    }
    out: dict[str, dict[str, float]] = {}
    with index:
        for name, terms in queries.items():
            index.search(terms[0])  # warm the page cache for this term
            samples = []
            cpu = []
            hits = 0
            for term in terms:
                started, cpu0 = time.perf_counter(), time.thread_time()
                result = index.search(term, limit=20)
                samples.append((time.perf_counter() - started) * 1000)
                cpu.append((time.thread_time() - cpu0) * 1000)
                hits = len(result.hits)
            out[name] = {"p50_ms": statistics.median(samples), "p95_ms": pct(samples, 0.95), "hits": hits,
                         "cpu_p50_ms": statistics.median(cpu), "cpu_p95_ms": pct(cpu, 0.95),
                         "term": terms[0]}  # fmt: skip
    return out


def measure_cli(root: Path, term: str, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "magent_store", "search", term, str(root), "--json"],
                       capture_output=True, check=True)  # fmt: skip
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def measure_grep(root: Path, term: str, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(["grep", "-rlF", "--", term, "global", "projects", "actions"], cwd=root,
                       capture_output=True)  # fmt: skip
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def stream_once(root: Path, name: str, indexed: bool, rng: random.Random) -> tuple[list[float], float]:
    """850 chunks at 131/s into a fresh session, a flush per 250 ms tick.

    Returns each flush's seconds and the process CPU seconds of the run
    (the index worker thread's included)."""
    cpu = time.process_time()
    store = Store(root)  # fsync always: what interactive magent does
    index = SearchIndex(root, live=True) if indexed else None
    session = store.open(name)
    if index is not None:
        session.after_flush = index.record_flush
    clock = time.time()
    session.append_event({"type": "thread-started", "thread-id": f"th-{name}", "created-at": clock})
    session.append_event({"type": "turn-started", "thread-id": f"th-{name}", "turn-id": "t0",
                          "payload": {"turn": {"id": "t0", "input": "stream"}}, "created-at": clock})  # fmt: skip
    session.append_event({"type": "item-started", "thread-id": f"th-{name}", "turn-id": "t0", "item-id": "a0",
                          "payload": {"item": {"id": "a0", "type": "message", "role": "assistant"}},
                          "created-at": clock})  # fmt: skip
    session.flush()
    words = [rng.choice(WORDS) for _ in range(4000)]
    seconds: list[float] = []
    started = time.perf_counter()
    next_tick = started + TICK_S
    for n in range(CHUNKS):
        due = started + n / CHUNKS_PER_S
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        chunk = " ".join(words[(n * 7) % 3990:(n * 7) % 3990 + 8]) + " "
        session.append_content("a0", chunk, False, time.time())
        if time.perf_counter() >= next_tick:
            seconds.append(session.flush().seconds)
            next_tick += TICK_S
    seconds.append(session.flush().seconds)
    session.close()
    if index is not None:
        index.close()
    return seconds, time.process_time() - cpu


def row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--mb", type=int, default=1024, help="megabytes of session files (default 1024)")
    parser.add_argument("--runs", type=int, default=6, help="streaming runs per side (default 6)")
    parser.add_argument("--repeats", type=int, default=40, help="queries per kind (default 40)")
    parser.add_argument("--tmpdir", type=Path, default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="search-bench-", dir=args.tmpdir))
    free = shutil.disk_usage(tmp).free
    need = args.mb * 1_000_000 * 5
    if free < need:
        print(f"search bench: {tmp} has {free / 1e9:.1f} GB free, needs about {need / 1e9:.1f} GB", file=sys.stderr)
        tmp.rmdir()
        return 2
    root = tmp / "sessions"
    results: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                               f"load {os.getloadavg()[0]:.1f} at start"}  # fmt: skip
    try:
        print(f"generating {args.sessions} sessions, {args.mb} MB, in {root}", file=sys.stderr)
        started = time.perf_counter()
        corpus = generate(root, args.sessions, args.mb * 1_000_000)
        corpus["generate_s"] = time.perf_counter() - started
        print(f"  {corpus['bytes'] / 1e6:.0f} MB in {corpus['generate_s']:.1f} s", file=sys.stderr)

        print("building the index", file=sys.stderr)
        index = SearchIndex(root)
        cpu0 = cpu_all()
        started = time.perf_counter()
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if time.perf_counter() - last[0] > 30:
                last[0] = time.perf_counter()
                print(f"  {done}/{total} sessions, {time.perf_counter() - started:.0f} s", file=sys.stderr)

        built = index.rebuild(progress)
        build_s = time.perf_counter() - started
        build_cpu = cpu_all() - cpu0
        index.close()
        index_bytes = dir_size(root / ".search")
        results["corpus"] = {k: v for k, v in corpus.items() if k != "rare_terms"}
        results["build"] = {"seconds": build_s, "cpu_seconds": build_cpu, "indexed_sessions": built.updated,
                            "skipped": len(built.skipped), "index_bytes": index_bytes}  # fmt: skip

        print("queries", file=sys.stderr)
        queries = measure_queries(root, corpus["rare_terms"], args.repeats)
        started = time.perf_counter()
        open_index(root)[0].close()
        catch_up_ms = (time.perf_counter() - started) * 1000
        cli_ms = measure_cli(root, "zephyrquux00050", 5)
        grep_ms = {name: measure_grep(root, q["term"], 3) for name, q in queries.items()}
        results["queries"] = queries
        results["open_and_catch_up_ms"] = catch_up_ms
        results["cli_ms"] = cli_ms
        results["grep_ms"] = grep_ms

        print("streaming, index on and off", file=sys.stderr)
        rng = random.Random(SEED)
        flushes: dict[str, list[float]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        for run in range(args.runs):
            for side in (("off", "on") if run % 2 == 0 else ("on", "off")):
                seconds, cpu_s = stream_once(root, f"stream-{side}-{run}", side == "on", rng)
                flushes[side] += seconds
                cpu[side].append(cpu_s)
        results["stream"] = {side: {"p50_ms": statistics.median(v) * 1000, "p99_ms": pct(v, 0.99) * 1000,
                                    "mean_ms": statistics.fmean(v) * 1000, "flushes": len(v),
                                    "cpu_ms_per_run": statistics.median(cpu[side]) * 1000}
                             for side, v in flushes.items()}  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    c, b = results["corpus"], results["build"]
    print(f"\nMachine: {results['machine']} (shared with other jobs while measuring).\n")
    print(f"Corpus: {c['sessions']} sessions, {c['bytes'] / 1e6:.0f} MB of session files "
          f"({c['text_bytes'] / 1e6:.0f} MB of text), generated in {c['generate_s']:.0f} s.\n")  # fmt: skip
    mbs = c["bytes"] / 1e6 / b["seconds"]
    print(row("build", "value", "target", ""))
    print(row("---", "---", "---", "---"))
    print(row("index build (session files)", f"{mbs:.1f} MB/s ({b['seconds']:.0f} s, CPU {b['cpu_seconds']:.0f} s "
              "with the reading processes)",
              ">= 50 MB/s", "PASS" if mbs >= 50 else "MISS"))  # fmt: skip
    print(row("index build (text)", f"{c['text_bytes'] / 1e6 / b['seconds']:.1f} MB/s", "", ""))
    print(row("index size", f"{b['index_bytes'] / 1e6:.0f} MB = {b['index_bytes'] / c['bytes']:.0%} of the "
              f"session files, {b['index_bytes'] / c['text_bytes']:.0%} of the text", "reported", ""))  # fmt: skip
    print()
    print(row("query", "hits", "p50 ms", "p95 ms", "target", "", "CPU p50 / p95 ms", "grep -rlF ms",
              "speed-up (p50)"))  # fmt: skip
    print(row(*["---"] * 9))
    for name, q in results["queries"].items():
        ok = q["p50_ms"] <= 20 and q["p95_ms"] <= 50
        print(row(name, q["hits"], f"{q['p50_ms']:.1f}", f"{q['p95_ms']:.1f}", "<= 20 / 50",
                  "PASS" if ok else "MISS", f"{q['cpu_p50_ms']:.1f} / {q['cpu_p95_ms']:.1f}",
                  f"{results['grep_ms'][name]:.0f}", f"{results['grep_ms'][name] / q['p50_ms']:.0f}x"))  # fmt: skip
    print(f"\nWhole command `magent-store search TERM ROOT --json` (Python start, catch-up check of every "
          f"session, query): median {results['cli_ms']:.0f} ms; opening the index and checking "
          f"{c['sessions']} sessions: {results['open_and_catch_up_ms']:.0f} ms.\n")  # fmt: skip
    s = results["stream"]
    added50 = s["on"]["p50_ms"] / s["off"]["p50_ms"] - 1
    added99 = s["on"]["p99_ms"] / s["off"]["p99_ms"] - 1
    print(row(f"flush, {CHUNKS} chunks at {CHUNKS_PER_S}/s", "index off", "index on", "added", "target", ""))
    print(row(*["---"] * 6))
    print(row("p50 ms", f"{s['off']['p50_ms']:.2f}", f"{s['on']['p50_ms']:.2f}", f"{added50:+.0%}", "<= 25%",
              "PASS" if added50 <= 0.25 else "MISS"))  # fmt: skip
    print(row("p99 ms", f"{s['off']['p99_ms']:.2f}", f"{s['on']['p99_ms']:.2f}", f"{added99:+.0%}", "<= 25%",
              "PASS" if added99 <= 0.25 else "MISS"))  # fmt: skip
    print(row("flushes", s["off"]["flushes"], s["on"]["flushes"], "", "", ""))
    per_flush = (s["on"]["cpu_ms_per_run"] - s["off"]["cpu_ms_per_run"]) / (s["on"]["flushes"] / args.runs)
    print(row("backend CPU per run (median; the index worker thread included)",
              f"{s['off']['cpu_ms_per_run']:.0f} ms", f"{s['on']['cpu_ms_per_run']:.0f} ms",
              f"{per_flush:+.2f} ms per flush", "", ""))  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(f"\n(figures also in {RESULTS.relative_to(REPO)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
