// The worker loop of docs/queues.md ("Migrate a worker") with a Node.js client and
// its default settings: pop a JSON job from `jobs`, record the result with
// SET and read it back with GET, then `ACK jobs <id>` through the client's
// raw-command API.
//
//   node worker.js <node-redis|ioredis> <redis URL> <brpop|rpop> <count>
//
// Prints {"ready":true} once connected, then, after `count` jobs, one line
// of JSON: the client, its version, the ids it processed and the sum of
// the ACK replies. It stays connected until its standard input closes, so
// that the caller can look at the proxy's connections meanwhile.

'use strict';

const [clientName, url, popMode, countArg] = process.argv.slice(2);
const count = Number(countArg);
if (!['node-redis', 'ioredis'].includes(clientName) || !url || !['brpop', 'rpop'].includes(popMode) || !(count >= 0)) {
  console.error('usage: node worker.js <node-redis|ioredis> <url> <brpop|rpop> <count>');
  process.exit(2);
}

// The same few operations, in each client's own API.
function nodeRedis() {
  const { createClient } = require('redis');
  const client = createClient({ url });
  client.on('error', fail);
  return {
    version: require('redis/package.json').version,
    connect: () => client.connect(),
    brpop: async () => {
      const r = await client.brPop('jobs', 1);
      return r === null ? null : r.element;
    },
    rpop: () => client.rPop('jobs'),
    set: (k, v) => client.set(k, v),
    get: (k) => client.get(k),
    ack: (id) => client.sendCommand(['ACK', 'jobs', id]),
    close: () => client.close(),
  };
}

function ioredis() {
  const Redis = require('ioredis');
  const redis = new Redis(url, { lazyConnect: true });
  redis.on('error', fail);
  return {
    version: require('ioredis/package.json').version,
    connect: () => redis.connect(),
    brpop: async () => {
      const r = await redis.brpop('jobs', 1);
      return r === null ? null : r[1];
    },
    rpop: () => redis.rpop('jobs'),
    set: (k, v) => redis.set(k, v),
    get: (k) => redis.get(k),
    ack: (id) => redis.call('ACK', 'jobs', id),
    close: () => redis.quit(),
  };
}

function fail(err) {
  console.error(`${clientName}: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
}

function stdinClosed() {
  return new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.on('close', resolve);
    process.stdin.resume();
  });
}

async function main() {
  const c = clientName === 'node-redis' ? nodeRedis() : ioredis();
  await c.connect();
  console.log(JSON.stringify({ ready: true }));
  const ids = [];
  let acked = 0;
  while (ids.length < count) {
    const message = popMode === 'brpop' ? await c.brpop() : await c.rpop();
    if (message === null) {
      if (popMode === 'rpop') await new Promise((r) => setTimeout(r, 5));
      continue;
    }
    const id = String(JSON.parse(message).id);
    const done = `done:${id}`;
    if ((await c.set(done, clientName)) !== 'OK') throw new Error(`SET ${done} failed`);
    if ((await c.get(done)) !== clientName) throw new Error(`GET ${done} is not ${clientName}`);
    acked += Number(await c.ack(id));
    ids.push(id);
  }
  console.log(JSON.stringify({ client: clientName, version: c.version, ids, acked }));
  await stdinClosed();
  await c.close();
}

main().catch(fail);
