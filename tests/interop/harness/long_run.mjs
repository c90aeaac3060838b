// The bench/long_run.py workload on @waku/sds: two participants, one channel,
// 100-byte messages, for as long as it takes (or until the caller stops us).
//
// Usage: node long_run.mjs '{"messages":100000,"chunk":64,"checkpoints":[10000,50000,100000]}'
// Prints one JSON line per figure as it is reached, so a caller that gives up
// still knows how far the run got:
//   {"kind":"rss","messages":N,"rss_mb":..,"heap_mb":..}   at each checkpoint (and at 0)
//   {"kind":"segment","segment":k,"to":N,"msg_per_s":..}   for each tenth of the run
//   {"kind":"progress","messages":N}                       every 1,000 messages
//   {"kind":"done","messages":N,"seconds":..}
//
// Workload (the same as bench/long_run.py runs on Chorus, minus its database):
// the two take turns; each turn one sends `chunk` messages (pushOutgoingMessage +
// processTasks, bytes captured from the send callback) and the other decodes and
// processes every one of them before the next turn. After each turn both run the
// incoming and outgoing sweeps their ReliableChannel would run on timers
// ("sweep": false leaves them out). The
// real clock is used. Payloads differ (the reference's id is sha256(payload)).
import { MessageChannel, Message, MessageChannelEvent } from "@waku/sds";

const params = JSON.parse(process.argv[2] ?? "{}");
const total = params.messages ?? 100_000;
const chunk = params.chunk ?? 64;
const checkpoints = (params.checkpoints ?? [10_000, 50_000, 100_000]).filter((c) => c <= total);
if (!checkpoints.includes(total)) checkpoints.push(total);
checkpoints.sort((x, y) => x - y);
const segment = Math.max(1, Math.floor(total / 10));
const size = 100;

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function memory(messages) {
  const m = process.memoryUsage();
  emit({ kind: "rss", messages, rss_mb: m.rss / 1048576, heap_mb: m.heapUsed / 1048576 });
}

function payload(i, sender) {
  return new TextEncoder().encode(`${sender} long-run message ${i} `.padEnd(size, "x").slice(0, size));
}

const members = ["waku-a", "waku-b"].map((id) => {
  const channel = new MessageChannel("long-run", id);
  const member = { channel, delivered: 0 };
  channel.addEventListener(MessageChannelEvent.InMessageDelivered, () => member.delivered++);
  return member;
});

memory(0);
const started = process.hrtime.bigint();
let segStart = started;
let segSent = 0;
let segments = 0;
let sent = 0;
let nextCp = 0;
let turn = 0;
while (sent < total) {
  const sender = members[turn % 2];
  const other = members[(turn + 1) % 2];
  turn++;
  const n = Math.min(chunk, total - sent);
  const encoded = [];
  for (let k = 0; k < n; k++) {
    sender.channel.pushOutgoingMessage(payload(sent + k, sender.channel.senderId), async (message) => {
      encoded.push(message.encode());
      return { success: true };
    });
  }
  await sender.channel.processTasks();
  for (const bytes of encoded) other.channel.pushIncomingMessage(Message.decode(bytes), undefined);
  await other.channel.processTasks();
  if (params.sweep ?? true) for (const m of members) {
    m.channel.sweepIncomingBuffer();
    m.channel.sweepOutgoingBuffer();
  }
  if (Math.floor((sent + n) / 1000) > Math.floor(sent / 1000)) emit({ kind: "progress", messages: sent + n });
  sent += n;
  segSent += n;
  if (segSent >= segment || sent === total) {
    const now = process.hrtime.bigint();
    segments++;
    emit({ kind: "segment", segment: segments, to: sent, msg_per_s: segSent / (Number(now - segStart) / 1e9) });
    segStart = now;
    segSent = 0;
  }
  while (nextCp < checkpoints.length && sent >= checkpoints[nextCp]) {
    memory(sent);
    nextCp++;
  }
}
const delivered = members.reduce((sum, m) => sum + m.delivered, 0);
if (delivered !== total) throw new Error(`expected ${total} deliveries, got ${delivered}`);
emit({ kind: "done", messages: total, seconds: Number(process.hrtime.bigint() - started) / 1e9 });
