#!/usr/bin/env python3
"""Chaos tests of kiln's fault tolerance, on the cli tests' fixture data.

kills:   a run under `kiln run` (the supervisor) whose trainer (or, with --np 2, one rank of
         it under mpirun) is killed with SIGKILL at random moments, N times in all (a run that
         ends first is followed by another from scratch); the supervisor restarts it from its
         newest checkpoint each time. Each must end with the weights of an uninterrupted run,
         byte for byte, and every resume must name a complete checkpoint.
damage:  a finished run's checkpoints damaged at random (a file truncated, bytes flipped, a
         file deleted, `latest` pointed elsewhere), N times; each resume must skip what is
         damaged, say so, and end with the uninterrupted run's weights; a damage that leaves
         no good checkpoint must be refused, never loaded.

Prints one line per event and a summary (kills survived out of kills made, damages detected
out of damages made, the supervisor's goodput); exit 0 when all hold, 1 otherwise, 77 when
it cannot run here (no fixture, no mpirun for --np 2).
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time


def descendants(root):
    """Pids of every process below root (from /proc's parent links)."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(d))
        except OSError:
            continue
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def is_trainer(pid, kiln):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return len(argv) > 1 and argv[0].decode(errors="replace") == kiln and argv[1] == b"train"


def same(a, b):
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


class Chaos:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.failures = 0
        self.kiln = os.path.abspath(args.kiln)
        self.mpirun = shutil.which(args.mpirun) if args.mpirun else None

    def say(self, msg):
        print(msg, flush=True)

    def fail(self, msg):
        self.failures += 1
        print("FAIL " + msg, flush=True)

    def train_cmd(self, extra):
        a = self.a
        cmd = [self.kiln, "train", "--layers", "2", "--heads", "4", "--embd", "128",
               "--context", "64", "--peak-gflops", "100", "--seq", "64",
               "--batch", str(24 // a.np), "--threads", "1", "--data", a.data,
               "--steps", str(a.steps)] + extra
        if a.np > 1:
            cmd += ["--zero", "1"]
            flags = ["--oversubscribe", "--allow-run-as-root"]
            return [self.mpirun] + flags + ["-np", str(a.np)] + cmd
        return cmd

    def reference(self, work):
        ref = os.path.join(work, "ref.st")
        r = subprocess.run(self.train_cmd(["--save", ref]), cwd=work, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            self.fail(f"the uninterrupted run failed ({r.returncode}): {r.stderr[-2000:]}")
            return None
        return ref

    def kills(self, work):
        """N SIGKILLs of the trainer (or one rank) at random moments under kiln run: in as many
        supervised runs from scratch (rounds) as it takes, however fast the machine; each
        round must end with the uninterrupted run's weights."""
        a = self.a
        ref = self.reference(work)
        if not ref:
            return
        made, rounds = 0, 0
        while made < a.kills and rounds < 50:
            rounds += 1
            made += self.kill_round(work, ref, rounds, a.kills - made, made)
        if made < a.kills:
            self.fail(f"only {made} of {a.kills} kills were made in {rounds} rounds")
        else:
            self.say(f"kills survived: {made} of {made} in {rounds} supervised run(s): every "
                     "final weights file equals the uninterrupted run's, byte for byte")

    def kill_round(self, work, ref, r, left, before):
        """One supervised run killed up to `left` times; returns the kills made."""
        a = self.a
        out = os.path.join(work, f"w{r}.st")
        ck = os.path.join(work, f"ck{r}")
        cmd = [self.kiln, "run", "--restarts", str(left + 5), "--backoff", "0", "--"]
        cmd += self.train_cmd(["--save", out, "--checkpoint-dir", ck, "--checkpoint-every",
                               "4", "--checkpoint-keep", "2", "--metrics",
                               os.path.join(work, f"m{r}.jsonl")])
        logpath = os.path.join(work, f"run{r}.log")
        log = open(logpath, "w")
        t0 = time.monotonic()
        sup = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT)
        made = 0
        while made < left and sup.poll() is None:
            # a trainer of the current attempt, then a random moment of its run
            pids = []
            deadline = time.monotonic() + 30
            while not pids and sup.poll() is None and time.monotonic() < deadline:
                pids = [p for p in descendants(sup.pid) if is_trainer(p, self.kiln)]
                time.sleep(0.01)
            if not pids:
                break
            time.sleep(self.rng.uniform(0.0, a.max_wait))
            victim = self.rng.choice(pids)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue  # it ended on its own: the next attempt (or the end)
            made += 1
            self.say(f"kill {before + made}: SIGKILL to pid {victim} at "
                     f"{time.monotonic() - t0:.2f} s of run {r}")
            # the attempt ends (mpirun takes the other ranks down) before the next kill
            end = time.monotonic() + 30
            while any(p in descendants(sup.pid) for p in pids) and time.monotonic() < end:
                time.sleep(0.01)
        try:
            rc = sup.wait(timeout=600)
        except subprocess.TimeoutExpired:
            sup.kill()
            rc = -1
        log.close()
        wall = time.monotonic() - t0
        text = open(logpath).read()
        goodput = [l for l in text.splitlines() if "goodput" in l]
        resumes = [l for l in text.splitlines() if l.startswith("resumed from")]
        self.say(f"run {r}: {made} kills; the supervised run exited {rc} after {wall:.1f} s; "
                 f"{len(resumes)} resumes")
        if goodput:
            self.say(goodput[-1])
        if rc != 0:
            self.fail(f"run {r} ended with {rc}: {text[-3000:]}")
        for l in resumes:  # a published step folder (checked whole), never a temporary one
            folder = os.path.basename(l.split()[2].rstrip(":"))
            if not re.fullmatch(r"step_[0-9]{8}", folder):
                self.fail(f"a resume loaded {folder}, which is not a published checkpoint")
        if not same(ref, out):
            self.fail(f"run {r}'s final weights differ from the uninterrupted run's")
        for d in os.listdir(ck) if os.path.isdir(ck) else []:
            if re.fullmatch(r"\.step_[0-9]{8}\.(tmp|gone)(\.[0-9]+)?", d):
                self.say(f"note: {d} is a write that was killed (never loaded)")
        return made

    def damage_one(self, ck, kind):
        """Damage the newest checkpoint (or latest); returns a description."""
        steps = sorted(d for d in os.listdir(ck) if d.startswith("step_"))
        newest = os.path.join(ck, steps[-1])
        files = sorted(f for f in os.listdir(newest))
        if kind == "latest":
            with open(os.path.join(ck, "latest"), "w") as f:
                f.write("step_99999999\n")
            return "latest names a missing folder"
        name = self.rng.choice(files)
        path = os.path.join(newest, name)
        size = os.path.getsize(path)
        if kind == "truncate":
            os.truncate(path, self.rng.randrange(0, max(size, 1)))
            return f"{steps[-1]}/{name} truncated to {os.path.getsize(path)} of {size} bytes"
        if kind == "flip":
            off = self.rng.randrange(0, size)
            with open(path, "r+b") as f:
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ (1 << self.rng.randrange(8))]))
            return f"{steps[-1]}/{name}: one bit flipped at byte {off} of {size}"
        os.unlink(path)
        return f"{steps[-1]}/{name} deleted"

    def damage(self, work):
        """N runs resumed from a checkpoint folder damaged at random."""
        a = self.a
        ref = self.reference(work)
        if not ref:
            return
        base = os.path.join(work, "base")
        half = a.steps // 2
        every = max(1, a.steps // 8)
        r = subprocess.run(self.train_cmd(["--save", os.path.join(work, "h.st"),
                                           "--checkpoint-dir", base, "--checkpoint-every",
                                           str(every), "--checkpoint-keep", "1000"]),
                           cwd=work, capture_output=True, text=True, timeout=600)
        # the base run went to the end; copies of its checkpoints up to half of it are damaged
        if r.returncode != 0:
            self.fail(f"the checkpointed run failed: {r.stderr[-2000:]}")
            return
        detected = 0
        for i in range(a.damages):
            ck = os.path.join(work, f"ck{i}")
            shutil.rmtree(ck, ignore_errors=True)
            shutil.copytree(base, ck, symlinks=True)
            # keep only checkpoints up to half the run, so that the resumed run has steps left
            for d in os.listdir(ck):
                if d.startswith("step_") and int(d[5:]) > half:
                    shutil.rmtree(os.path.join(ck, d))
            kept = max(int(d[5:]) for d in os.listdir(ck) if d.startswith("step_"))
            with open(os.path.join(ck, "latest"), "w") as f:
                f.write(f"step_{kept:08d}\n")
            kind = self.rng.choice(["truncate", "flip", "delete", "latest"])
            what = self.damage_one(ck, kind)
            out = os.path.join(work, f"w{i}.st")
            r = subprocess.run(self.train_cmd(["--save", out, "--resume", ck]), cwd=work,
                               capture_output=True, text=True, timeout=600)
            text = r.stdout + r.stderr
            said = ("not loading" in text or "not there" in text or "rebuilt" in text
                    or "replica" in text)
            resumed = [l for l in text.splitlines() if l.startswith("resumed from")]
            if r.returncode == 0 and same(ref, out) and resumed and said:
                detected += 1
                self.say(f"damage {i + 1}: {what}: detected; {resumed[0]}")
            elif r.returncode == 0 and same(ref, out) and resumed:
                # a damage that touched nothing the resume reads (there is none today)
                self.fail(f"damage {i + 1}: {what}: resumed without a word about it: "
                          f"{resumed[0]}")
            else:
                self.fail(f"damage {i + 1}: {what}: exit {r.returncode}, weights "
                          f"{'equal' if same(ref, out) else 'differ'}: {text[-1500:]}")
        # every checkpoint damaged: refused, and nothing written
        ck = os.path.join(work, "ck_all")
        shutil.rmtree(ck, ignore_errors=True)
        shutil.copytree(base, ck, symlinks=True)
        for d in os.listdir(ck):
            if d.startswith("step_"):
                os.truncate(os.path.join(ck, d, "model.safetensors"), 100)
        out = os.path.join(work, "none.st")
        r = subprocess.run(self.train_cmd(["--save", out, "--resume", ck]), cwd=work,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 and "no good checkpoint" in r.stderr and not os.path.exists(out):
            self.say("every checkpoint damaged: refused, nothing written")
        else:
            self.fail(f"every checkpoint damaged: exit {r.returncode}: {r.stderr[-800:]}")
        self.say(f"damages detected: {detected} of {a.damages}")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["kills", "damage"])
    p.add_argument("--kiln", default=os.environ.get("KILN_BIN", "build/kiln"))
    p.add_argument("--data", default=None, help="token shards (default: the cli fixture's)")
    p.add_argument("--work", default=None, help="a folder for the runs (made empty)")
    p.add_argument("--np", type=int, default=1, help="ranks (2: mpirun, one rank killed)")
    p.add_argument("--mpirun", default=os.environ.get("KILN_MPIRUN", "mpirun"),
                   help="the MPI launcher (KILN_MPIRUN; empty: kiln has no MPI, --np 2 skips)")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--damages", type=int, default=12)
    p.add_argument("--steps", type=int, default=None,
                   help="steps of the run (default: 200 for kills, 40 for damage)")
    p.add_argument("--max-wait", type=float, default=0.8,
                   help="a kill comes at most this many seconds after a (re)start")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if a.steps is None:
        a.steps = 200 if a.mode == "kills" else 40
    root = os.path.abspath(os.environ.get("KILN_CLI_WORK", "/tmp"))
    if a.data is None:
        a.data = os.path.join(root, "fixture", "data", "train_000.bin")
    a.data = os.path.abspath(a.data)
    if not os.path.exists(a.data):
        print(f"SKIP: no data at {a.data} (the cli fixture builds it)")
        return 77
    if a.np > 1 and not (a.mpirun and shutil.which(a.mpirun)):
        print("SKIP: no mpirun (apt-get install openmpi-bin libopenmpi-dev)")
        return 77
    work = a.work or os.path.join(root, f"chaos-{a.mode}-np{a.np}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    c = Chaos(a)
    c.say(f"chaos {a.mode}: seed {a.seed}, {a.np} rank(s), work in {work}")
    getattr(c, a.mode)(work)
    if c.failures:
        print(f"{c.failures} failure(s); the runs are in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("all held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
