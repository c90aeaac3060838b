// The compare_waku workload run in-process on @waku/sds (no stdin round trips).
//
// Usage: node bench.mjs '{"participants":10,"causal_history":2,"messages":500,"content_size":64}'
// Prints one JSON line: deliveries, seconds (wall), cpu_seconds (all of the
// process's threads, garbage collection included), deliveries_per_s, bytes_per_message.
//
// Workload (bench/compare_waku.py runs the same one on Chorus): `participants`
// members of one channel; `messages` content messages sent round-robin, each
// broadcast at once, without loss, to every other member, which decodes it,
// pushes it and processes its task queue. A manual clock advances 1 ms per
// message so Lamport time matches the Python run. Timed after a short warm-up
// on a separate channel so the JIT has compiled the hot paths.
import { MessageChannel, Message, MessageChannelEvent } from "@waku/sds";

const params = JSON.parse(process.argv[2] ?? "{}");
const participants = params.participants ?? 2;
const causalHistory = params.causal_history ?? 2;
const messages = params.messages ?? 200;
const contentSize = params.content_size ?? 64;
const warmup = params.warmup ?? 50;

let now = 1_700_000_000_000;
Date.now = () => now;

function payload(i, sender) {
  // Distinct per message: the reference's id is sha256(payload).
  const text = `${sender} message ${i} `.padEnd(contentSize, "x");
  return new TextEncoder().encode(text.slice(0, contentSize));
}

async function run(channelId, count) {
  const members = [];
  for (let p = 0; p < participants; p++) {
    const channel = new MessageChannel(channelId, `p${p}`, { causalHistorySize: causalHistory });
    let delivered = 0;
    channel.addEventListener(MessageChannelEvent.InMessageDelivered, () => delivered++);
    members.push({ channel, delivered: () => delivered });
  }
  let bytes = 0;
  const cpuStart = process.cpuUsage();
  const start = process.hrtime.bigint();
  for (let i = 0; i < count; i++) {
    now += 1;
    const sender = members[i % participants];
    let encoded = null;
    sender.channel.pushOutgoingMessage(payload(i, sender.channel.senderId), async (message) => {
      encoded = message.encode();
      return { success: true };
    });
    await sender.channel.processTasks();
    bytes += encoded.length;
    for (const member of members) {
      if (member === sender) continue;
      member.channel.pushIncomingMessage(Message.decode(encoded), undefined);
      await member.channel.processTasks();
    }
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const cpu = process.cpuUsage(cpuStart);
  const deliveries = members.reduce((sum, m) => sum + m.delivered(), 0);
  return {
    deliveries,
    seconds,
    cpu_seconds: (cpu.user + cpu.system) / 1e6,
    bytes_per_message: bytes / count
  };
}

await run("warmup", Math.min(warmup, messages));
const result = await run("bench", messages);
const expected = messages * (participants - 1);
if (result.deliveries !== expected) {
  throw new Error(`expected ${expected} deliveries, got ${result.deliveries}`);
}
process.stdout.write(
  JSON.stringify({ ...result, deliveries_per_s: result.deliveries / result.seconds }) + "\n"
);
