#!/usr/bin/python3
"""cli.grid_groups: `trident grid` against the rank order written out independently here,
world_rank = tp + TP * (cp + CP * (dp + DP * pp)) (Megatron's order, FORMAT.md): the TP, CP,
DP, PP and DP x CP groups and the embedding groups of several shapes, run alone and under
mpirun on the matching world (rank 0 prints one line); without --cp the grid is the
three-axis one it was (cp = 1 changes no rank).

Usage: TRIDENT=build/trident test/cli/grid_groups.py
"""

import itertools
import json
import os
import subprocess
import sys

TRIDENT = os.environ["TRIDENT"]
FAILS = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILS.append(what)


def rank(s, tp, cp, dp, pp):
    return tp + s["tp"] * (cp + s["cp"] * (dp + s["dp"] * pp))


def expected(s):
    """Every group, from the formula: the ranks that differ only along the group's axes,
    ordered along them (DP x CP: cp fastest), groups by their smallest rank."""
    axes = ["tp", "cp", "dp", "pp"]
    out = {}
    for name, along in [("tp", ["tp"]), ("cp", ["cp"]), ("dp", ["dp"]), ("pp", ["pp"]),
                        ("dp_cp", ["cp", "dp"])]:
        rest = [a for a in axes if a not in along]
        groups = []
        for fixed in itertools.product(*[range(s[a]) for a in rest]):
            coord = dict(zip(rest, fixed))
            g = []
            # itertools.product varies the last factor fastest: list `along` slowest first.
            for idx in itertools.product(*[range(s[a]) for a in reversed(along)]):
                coord.update(zip(reversed(along), idx))
                g.append(rank(s, **coord))
            groups.append(g)
        out[name] = sorted(groups, key=min)
    # 1f1b's embedding group: the first and the last pipeline rank of every pipeline.
    out["embedding"] = [sorted({g[0], g[-1]}) for g in out["pp"]]
    return out


def grid(s, np_=1, flags=None):
    cmd = [TRIDENT, "grid"]
    for a in flags if flags is not None else ["tp", "cp", "dp", "pp"]:
        cmd += [f"--{a}", str(s[a])]
    if np_ > 1:
        cmd = ["mpirun", "-np", str(np_), "--oversubscribe", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or len(lines) != 1:
        return None, p.stdout + p.stderr
    return json.loads(lines[0]), ""


def main():
    shapes = [dict(tp=2, cp=2, dp=2, pp=2), dict(tp=1, cp=4, dp=1, pp=1),
              dict(tp=3, cp=2, dp=1, pp=2), dict(tp=1, cp=2, dp=3, pp=1),
              dict(tp=2, cp=1, dp=2, pp=4)]
    for s in shapes:
        got, err = grid(s)
        check(got == expected(s), f"grid {s} alone {err.strip()[-300:]}")
    # The 16-rank example, spelled out (FORMAT.md shows it).
    got, _ = grid(dict(tp=2, cp=2, dp=2, pp=2))
    check(got is not None and got["cp"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11],
                                            [12, 14], [13, 15]]
          and got["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14],
                            [11, 15]]
          and got["dp_cp"] == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]],
          "16 ranks, tp 2 cp 2 dp 2 pp 2: the CP, DP and DP x CP groups as written out")
    # Without --cp: the three-axis grid, rank for rank.
    s = dict(tp=2, cp=1, dp=2, pp=4)
    got, _ = grid(s, flags=["tp", "dp", "pp"])
    check(got == expected(s) and got["dp_cp"] == got["dp"],
          "no --cp: tp + TP * (dp + DP * pp), and dp_cp = dp")
    # Under mpirun on the matching world: one line, the same groups.
    s = dict(tp=2, cp=2, dp=1, pp=1)
    got, err = grid(s, np_=4)
    check(got == expected(s), f"grid --tp 2 --cp 2 under mpirun -np 4 {err.strip()[-300:]}")
    if FAILS:
        print(f"{len(FAILS)} check(s) failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
