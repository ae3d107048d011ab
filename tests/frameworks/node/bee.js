'use strict';
// bee-queue side of killtest.py: queue "jobs" under bee-queue's default
// prefix ("bq"), so its keys are bq:jobs:waiting, bq:jobs:active, ...
//
//   node bee.js enqueue URL N SEED WORKDIR
//   node bee.js worker URL checker|nochecker
//
// The worker runs queue.process(2, handler). "checker" also calls
// queue.checkStalledJobs(5000) as bee-queue's README recommends (interval
// equal to the default stallInterval); "nochecker" does not, so stalled
// jobs move back only in the check that process() itself runs once at
// start-up, and then only if no check ran in the stallInterval before.

const Queue = require('bee-queue');
const jobkit = require('./jobkit');

const QUEUE = 'jobs';
const CONCURRENCY = 2;
const CHECK_INTERVAL_MS = 5000;
const BATCH = 500;

async function enqueue(url, n, seed, workdir) {
  const queue = new Queue(QUEUE, {
    redis: { url },
    isWorker: false,
    getEvents: false,
  });
  queue.on('error', (err) => jobkit.log('bee', `queue error: ${err.stack || err}`));
  await queue.ready();
  for (let start = 0; start < n; start += BATCH) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + BATCH); i++) {
      jobs.push(queue.createJob(jobkit.jobData(i, seed, workdir)));
    }
    const errors = await queue.saveAll(jobs);
    if (errors.size) {
      const [job, err] = errors.entries().next().value;
      throw new Error(`saving job ${job.data.i} failed (${errors.size} failures): ${err}`);
    }
  }
  await queue.close();
}

async function worker(url, variant) {
  const queue = new Queue(QUEUE, { redis: { url } });
  queue.on('error', (err) => jobkit.log('bee', `queue error: ${err.stack || err}`));
  queue.on('stalled', (jobId) => jobkit.log('bee', `stalled job ${jobId} moved back to waiting`));
  queue.on('failed', (job, err) => jobkit.log('bee', `job ${job.id} failed: ${err}`));
  await queue.ready();
  queue.process(CONCURRENCY, (job) => jobkit.runJob(job.data));
  if (variant === 'checker') {
    queue.checkStalledJobs(CHECK_INTERVAL_MS);
  }
  jobkit.log('bee', `worker (${variant}) on ${url}, concurrency ${CONCURRENCY}`);
}

jobkit.main('bee.js', { enqueue, worker, variants: ['checker', 'nochecker'] });
