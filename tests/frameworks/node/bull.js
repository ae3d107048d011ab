'use strict';
// Bull 3 side of killtest.py: queue "jobs" under Bull's default prefix
// ("bull"), so its keys are bull:jobs:wait, bull:jobs:active, ...
//
//   node bull.js enqueue URL N SEED WORKDIR
//   node bull.js worker URL
//
// The worker keeps Bull's default settings (lockDuration 30 s, renewed every
// 15 s; stalled-job check every 30 s; maxStalledCount 1) and runs
// queue.process(2, handler).

const Queue = require('bull');
const jobkit = require('./jobkit');

const QUEUE = 'jobs';
const CONCURRENCY = 2;
const BATCH = 500;

async function enqueue(url, n, seed, workdir) {
  const queue = new Queue(QUEUE, url);
  queue.on('error', (err) => jobkit.log('bull', `queue error: ${err.stack || err}`));
  await queue.isReady();
  for (let start = 0; start < n; start += BATCH) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + BATCH); i++) {
      jobs.push({ data: jobkit.jobData(i, seed, workdir) });
    }
    await queue.addBulk(jobs);
  }
  await queue.close();
}

async function worker(url) {
  const queue = new Queue(QUEUE, url);
  queue.on('error', (err) => jobkit.log('bull', `queue error: ${err.stack || err}`));
  queue.on('stalled', (job) => jobkit.log('bull', `stalled job ${job.id} (i=${job.data.i}) moved back to wait`));
  queue.on('failed', (job, err) => jobkit.log('bull', `job ${job.id} (i=${job.data.i}) failed: ${err}`));
  await queue.isReady();
  // process() resolves only when the queue closes: not awaited.
  queue.process(CONCURRENCY, (job) => jobkit.runJob(job.data)).catch((err) => {
    jobkit.log('bull', `process failed: ${err.stack || err}`);
    process.exit(1);
  });
  jobkit.log('bull', `worker on ${url}, concurrency ${CONCURRENCY}`);
}

jobkit.main('bull.js', { enqueue, worker });
