"""What the Node adapters (fw_bee_queue.py, fw_bull.py) share: running the
scripts of node/ with the packages that `npm ci` installed there."""

import os
import shutil
import subprocess

import jobkit

NODE_DIR = os.path.join(jobkit.HERE, "node")
HINT = "run tests/frameworks/setup.sh (npm ci --prefix tests/frameworks/node; needs Node.js 20 or later)"


def node():
    path = shutil.which("node")
    if path is None:
        raise RuntimeError("node not found: " + HINT)
    return path


def ready(package):
    """Raises RuntimeError naming what to install unless node loads `package`
    from node/node_modules."""
    r = subprocess.run([node(), "-e", "require(%r)" % package], cwd=NODE_DIR, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("node cannot load %s from %s: %s\n%s"
                           % (package, NODE_DIR, HINT, r.stdout.decode(errors="replace")))


def enqueue(script, url, n, seed, workdir):
    jobkit.run_enqueue([node(), os.path.join(NODE_DIR, script), "enqueue", url, str(n), str(seed), workdir], {})


def worker_argv(script, url, *args):
    return [node(), os.path.join(NODE_DIR, script), "worker", url] + list(args)


def adapter(script, package, variants=False):
    """ready, enqueue and worker of the adapter for node/`script`, which
    needs `package`; with `variants`, its worker is told the variant."""

    def adapter_ready(variant):
        ready(package)

    def adapter_enqueue(variant, url, n, seed, workdir):
        enqueue(script, url, n, seed, workdir)

    def adapter_worker(variant, url, workdir, seed):
        args = [variant] if variants else []
        return worker_argv(script, url, *args), {}, jobkit.HERE

    return adapter_ready, adapter_enqueue, adapter_worker
