# frozen_string_literal: true

# Enqueues killtest.py's jobs 0..N-1 with Sidekiq's client API:
#   ruby enqueue.rb URL N SEED WORKDIR

require_relative "worker"

if ARGV.size != 4
  warn "usage: ruby enqueue.rb URL N SEED WORKDIR"
  exit 2
end
url, n, seed, workdir = ARGV[0], Integer(ARGV[1]), Integer(ARGV[2]), ARGV[3]

Sidekiq.configure_client do |config|
  config.redis = {url: url}
end

n.times do |i|
  jid = KilltestJob.perform_async(i, Killtest.duration_ms(i, seed), workdir)
  raise "perform_async returned no jid for job #{i}" unless jid
end
