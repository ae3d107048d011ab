# frozen_string_literal: true

# Sidekiq side of killtest.py: the job class that `sidekiq -r <this file>`
# loads, and the job's start/sleep/done lines (the same as ../jobkit.py).
# Sidekiq's defaults otherwise: queue "default", retries on, concurrency 10.

require "sidekiq"

# Sidekiq 6.4.1 calls redis-rb 4.8's brpop with the timeout as a positional
# argument, which redis-rb warns about on every fetch; the warnings (and the
# one for sadd in the client) would drown the worker's log. Warnings only:
# no command changes.
Redis.silence_deprecations = true

module Killtest
  START_LOG = "start.log"
  DONE_LOG = "done.log"

  # 100 + (((i + 1) * 2654435761 + seed * 40503) mod 2^32) mod 201, as in
  # ../jobkit.py.
  def self.duration_ms(i, seed)
    100 + (((i + 1) * 2654435761 + seed * 40503) % 4294967296) % 201
  end

  # One write(2) on an O_APPEND file, then fsync(2): the line has to be on
  # disk before the SIGKILL that may follow right after.
  def self.mark(workdir, name, i)
    File.open(File.join(workdir, name), "a") do |f|
      f.write("#{i}\n")
      f.flush
      f.fsync
    end
  end
end

class KilltestJob
  include Sidekiq::Worker

  def perform(i, ms, workdir)
    Killtest.mark(workdir, Killtest::START_LOG, i)
    sleep(ms / 1000.0)
    Killtest.mark(workdir, Killtest::DONE_LOG, i)
  end
end
