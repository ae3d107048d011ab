'use strict';
// What every job of killtest.py does, for the Node frameworks: the same
// start/sleep/done lines and the same duration formula as ../jobkit.py.

const fs = require('fs');
const path = require('path');

const START_LOG = 'start.log';
const DONE_LOG = 'done.log';

// 100 + (((i + 1) * 2654435761 + seed * 40503) mod 2^32) mod 201, in BigInt:
// the product leaves the exact range of a double for large i.
function durationMs(i, seed) {
  const x = (BigInt(i) + 1n) * 2654435761n + BigInt(seed) * 40503n;
  return 100 + Number((x % 4294967296n) % 201n);
}

// One write(2) on an O_APPEND file, then fsync(2): the line has to be on
// disk before the SIGKILL that may follow right after.
function mark(workdir, name, i) {
  const fd = fs.openSync(path.join(workdir, name), 'a');
  try {
    fs.writeSync(fd, `${i}\n`);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

async function runJob(data) {
  const i = Number(data.i);
  mark(data.workdir, START_LOG, i);
  await new Promise((resolve) => setTimeout(resolve, Number(data.ms)));
  mark(data.workdir, DONE_LOG, i);
}

function jobData(i, seed, workdir) {
  return { i, ms: durationMs(i, seed), workdir };
}

function usage(script, lines) {
  process.stderr.write(lines.map((l) => `usage: node ${script} ${l}\n`).join(''));
  process.exit(2);
}

function log(what, msg) {
  process.stderr.write(`${what}[${process.pid}]: ${msg}\n`);
}

// The command line of a framework's script: `enqueue URL N SEED WORKDIR`,
// or `worker URL`, followed by one of `variants` when it has any. A failure
// is logged under the script's name and exits 1.
function main(script, { enqueue, worker, variants }) {
  const [cmd, ...args] = process.argv.slice(2);
  const workerArgs = variants ? 2 : 1;
  let done;
  if (cmd === 'enqueue' && args.length === 4) {
    done = enqueue(args[0], Number(args[1]), Number(args[2]), args[3]).then(() => process.exit(0));
  } else if (cmd === 'worker' && args.length === workerArgs && (!variants || variants.includes(args[1]))) {
    done = worker(...args);
  } else {
    usage(script, ['enqueue URL N SEED WORKDIR', variants ? `worker URL ${variants.join('|')}` : 'worker URL']);
  }
  done.catch((err) => {
    log(script.replace(/\.js$/, ''), `${cmd} failed: ${err.stack || err}`);
    process.exit(1);
  });
}

module.exports = { durationMs, mark, runJob, jobData, usage, log, main };
