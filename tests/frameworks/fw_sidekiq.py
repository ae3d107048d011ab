"""killtest.py adapter for Sidekiq 6.4.1 (Debian's ruby-sidekiq): jobs of
class KilltestJob (ruby/worker.rb) pushed with perform_async to queue
"default"; one `sidekiq -r ruby/worker.rb` process with Sidekiq's defaults
(10 threads, BRPOP fetch, retries on), Redis from REDIS_URL."""

import os
import shutil
import subprocess

import jobkit

NAME = ["default"]
RUBY_DIR = os.path.join(jobkit.HERE, "ruby")
HINT = "run tests/frameworks/setup.sh (apt-get install ruby-sidekiq)"


def _which(name):
    path = shutil.which(name)
    if path is None:
        raise RuntimeError("%s not found: %s" % (name, HINT))
    return path


def ready(variant):
    _which("sidekiq")
    r = subprocess.run([_which("ruby"), "-e", 'require "sidekiq"; puts Sidekiq::VERSION'],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("ruby cannot load sidekiq: %s\n%s" % (HINT, r.stdout.decode(errors="replace")))


def enqueue(variant, url, n, seed, workdir):
    jobkit.run_enqueue([_which("ruby"), os.path.join(RUBY_DIR, "enqueue.rb"), url, str(n), str(seed), workdir], {})


def worker(variant, url, workdir, seed):
    argv = [_which("sidekiq"), "-r", os.path.join(RUBY_DIR, "worker.rb")]
    return argv, {"REDIS_URL": url}, jobkit.HERE
