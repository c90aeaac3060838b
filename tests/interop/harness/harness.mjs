// Chorus interop harness: drives @waku/sds MessageChannels from JSON lines.
//
// One JSON command per line on stdin, one JSON response per line on stdout
// (the negentropy way of testing implementations against each other). One
// process hosts any number of participants, keyed by "id". Bytes travel as
// base64. Every command may carry "now" (epoch ms): the reference reads
// Date.now() for its Lamport clock, lost-message timeout and SDS-R timers, so
// the harness replaces Date.now with a clock the Python test sets, and both
// implementations then run on the same manual clock.
//
// Commands (response fields in brackets):
//   new        {id, channel, causal_history_size?, possible_acks_threshold?,
//               timeout_lost_ms?, repair?, repair_config?}
//   send       {id, content_b64, hint_b64?}      [message_id, out]
//   ephemeral  {id, content_b64}                 [out]
//   sync       {id}                              [sent, out]
//   receive    {id, data_b64, hint_b64?, offset?} [kind, message_id]
//   process    {id}
//   sweep_in   {id}                              [missing]
//   sweep_out  {id}                              [unacknowledged, possibly_acknowledged]
//   sweep_repair {id}                            [out]
//   events     {id}                              [events]
//   log        {id}                              [ids]
//   filter     {id}                              [filter_b64]
//   bloom      {ids, lookup?, offset?}           [filter_b64, found]
//   repair_calc {id, cases: [{sender_id, message_id}]}  [results: t_req, t_resp, in_group]
//   version                                      [version]
//   quit
// "out" lists the base64 datagrams the participant would broadcast.
import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";

import {
  MessageChannel,
  MessageChannelEvent,
  Message,
  isContentMessage,
  isEphemeralMessage,
  isSyncMessage
} from "@waku/sds";

const realNow = Date.now.bind(Date);
let fakeNow = null;
Date.now = () => (fakeNow === null ? realNow() : fakeNow);

const b64 = (bytes) => Buffer.from(bytes).toString("base64");
const unb64 = (text) => new Uint8Array(Buffer.from(text, "base64"));

/** Bytes as they arrive from a transport: a view into a larger buffer at `offset`. */
function embedded(bytes, offset) {
  if (!offset) return bytes;
  const backing = new Uint8Array(offset + bytes.length + 7);
  backing.fill(0xff); // garbage around the message, as in a network frame
  backing.set(bytes, offset);
  return backing.subarray(offset, offset + bytes.length);
}

function kindOf(message) {
  if (isContentMessage(message)) return "content";
  if (isSyncMessage(message)) return "sync";
  if (isEphemeralMessage(message)) return "ephemeral";
  return "invalid";
}

const ids = (entries) => (entries ?? []).map((e) => e.messageId);

/** One reference participant: its channel and the events it emitted. */
class Participant {
  constructor(cmd) {
    const options = {};
    if (cmd.causal_history_size !== undefined) options.causalHistorySize = cmd.causal_history_size;
    if (cmd.possible_acks_threshold !== undefined)
      options.possibleAcksThreshold = cmd.possible_acks_threshold;
    if (cmd.timeout_lost_ms !== undefined) options.timeoutForLostMessagesMs = cmd.timeout_lost_ms;
    if (cmd.repair !== undefined) options.enableRepair = cmd.repair;
    if (cmd.repair_config !== undefined) options.repairConfig = cmd.repair_config;
    this.channel = new MessageChannel(cmd.channel, cmd.id, options);
    this.events = [];
    // The reference's RepairManager dispatches its "queued" events under these
    // bare names rather than the MessageChannelEvent values, so listen to both.
    const names = [...Object.values(MessageChannelEvent), "RepairRequestQueued", "RepairResponseQueued"];
    for (const name of names) {
      this.channel.addEventListener(name, (event) => this.record(name, event.detail));
    }
  }

  record(name, detail) {
    const E = MessageChannelEvent;
    switch (name) {
      case E.InMessageDelivered: {
        const message = this.channel.localHistory.find((m) => m.messageId === detail);
        this.events.push({
          type: "delivered",
          message_id: detail,
          sender_id: message?.senderId ?? null,
          content_b64: message ? b64(message.content) : null
        });
        return;
      }
      case E.InMessageReceived:
        this.events.push({ type: "received", message_id: detail.messageId, sender_id: detail.senderId });
        return;
      case E.InSyncReceived:
        this.events.push({ type: "sync_received", message_id: detail.messageId, sender_id: detail.senderId });
        return;
      case E.OutMessageSent:
        this.events.push({ type: "sent", message_id: detail.messageId });
        return;
      case E.OutSyncSent:
        this.events.push({ type: "sync_sent", message_id: detail.messageId });
        return;
      case E.OutMessageAcknowledged:
        this.events.push({ type: "acknowledged", message_id: detail });
        return;
      case E.OutMessagePossiblyAcknowledged:
        this.events.push({ type: "possibly_acknowledged", message_id: detail.messageId, count: detail.count });
        return;
      case E.InMessageMissing:
        // The reference emits this after every incoming sweep, empty or not.
        if (detail.length)
          this.events.push({ type: "missing", message_ids: ids(detail), entries: detail.map(entryJson) });
        return;
      case E.InMessageLost:
        this.events.push({ type: "lost", message_ids: ids(detail) });
        return;
      case E.ErrorTask:
        this.events.push({ type: "error", error: String(detail?.error ?? detail) });
        return;
      default:
        this.events.push({ type: name.replace(/^sds:/, ""), detail: plain(detail) });
    }
  }
}

function entryJson(e) {
  return {
    message_id: e.messageId,
    sender_id: e.senderId ?? null,
    hint_b64: e.retrievalHint ? b64(e.retrievalHint) : null
  };
}

/** JSON-safe copy (BigInt to string, bytes to base64). */
function plain(value) {
  return JSON.parse(
    JSON.stringify(value ?? null, (_, v) =>
      typeof v === "bigint" ? v.toString() : v instanceof Uint8Array ? b64(v) : v
    )
  );
}

const participants = new Map();

function get(cmd) {
  const p = participants.get(cmd.id);
  if (!p) throw new Error(`unknown participant ${cmd.id}`);
  return p;
}

const handlers = {
  async version() {
    const pkg = new URL("./node_modules/@waku/sds/package.json", import.meta.url);
    return { version: JSON.parse(readFileSync(pkg, "utf8")).version, node: process.version };
  },
  async new(cmd) {
    if (participants.has(cmd.id)) throw new Error(`participant ${cmd.id} exists`);
    participants.set(cmd.id, new Participant(cmd));
    return {};
  },
  async send(cmd) {
    const { channel } = get(cmd);
    const out = [];
    let messageId = null;
    channel.pushOutgoingMessage(unb64(cmd.content_b64), async (message) => {
      messageId = message.messageId;
      out.push(b64(message.encode()));
      return { success: true, retrievalHint: cmd.hint_b64 ? unb64(cmd.hint_b64) : undefined };
    });
    await channel.processTasks();
    return { message_id: messageId, out };
  },
  async ephemeral(cmd) {
    const { channel } = get(cmd);
    const out = [];
    await channel.pushOutgoingEphemeralMessage(unb64(cmd.content_b64), async (message) => {
      out.push(b64(message.encode()));
      return true;
    });
    await channel.processTasks();
    return { out };
  },
  async sync(cmd) {
    const { channel } = get(cmd);
    const out = [];
    const sent = await channel.pushOutgoingSyncMessage(async (message) => {
      out.push(b64(message.encode()));
      return true;
    });
    return { sent, out };
  },
  async receive(cmd) {
    const p = get(cmd);
    const message = Message.decode(embedded(unb64(cmd.data_b64), cmd.offset ?? 0));
    if (!message) return { kind: "invalid", message_id: null };
    const kind = kindOf(message);
    if (kind === "ephemeral" && message.senderId !== p.channel.senderId) {
      // The reference's MessageChannel drops ephemeral messages without an
      // event (its ReliableChannel hands them to the app before SDS); report
      // what the decoder understood so the test can check it.
      p.events.push({
        type: "ephemeral",
        message_id: message.messageId,
        sender_id: message.senderId,
        content_b64: b64(message.content)
      });
    }
    p.channel.pushIncomingMessage(message, cmd.hint_b64 ? unb64(cmd.hint_b64) : undefined);
    await p.channel.processTasks();
    return { kind, message_id: message.messageId };
  },
  async process(cmd) {
    await get(cmd).channel.processTasks();
    return {};
  },
  async sweep_in(cmd) {
    return { missing: ids(get(cmd).channel.sweepIncomingBuffer()) };
  },
  async sweep_out(cmd) {
    const { unacknowledged, possiblyAcknowledged } = get(cmd).channel.sweepOutgoingBuffer();
    // With each id, what an application would rebroadcast: the stored message, unchanged.
    const listed = (messages) => messages.map((m) => ({ message_id: m.messageId, data_b64: b64(m.encode()) }));
    return {
      unacknowledged: listed(unacknowledged),
      possibly_acknowledged: listed(possiblyAcknowledged)
    };
  },
  async sweep_repair(cmd) {
    const out = [];
    await get(cmd).channel.sweepRepairIncomingBuffer(async (message) => {
      out.push(b64(message.encode()));
      return true;
    });
    return { out };
  },
  async events(cmd) {
    const p = get(cmd);
    const events = p.events;
    p.events = [];
    return { events };
  },
  async log(cmd) {
    return { ids: get(cmd).channel.localHistory.slice().map((m) => m.messageId) };
  },
  async filter(cmd) {
    return { filter_b64: b64(get(cmd).channel.filter.toBytes()) };
  },
  async bloom(cmd) {
    // A fresh filter of the channel's default class and options. Lookups run
    // on a copy read back with fromBytes from a view at `offset` into a larger
    // buffer, the path a received message's filter takes.
    const probe = new MessageChannel("bloom-probe", "bloom-probe", { enableRepair: false });
    const Filter = probe.filter.constructor;
    const filter = new Filter(probe.filter.options);
    for (const id of cmd.ids) filter.insert(id);
    const bytes = filter.toBytes();
    const reread = Filter.fromBytes(embedded(bytes, cmd.offset ?? 0), probe.filter.options);
    return {
      filter_b64: b64(bytes),
      found: (cmd.lookup ?? []).map((id) => reread.lookup(id))
    };
  },
  async repair_calc(cmd) {
    // The reference's SDS-R timing and response-group rules for (participant, sender, id).
    const manager = get(cmd).channel.repairManager;
    return {
      results: cmd.cases.map(({ sender_id, message_id }) => ({
        t_req: manager.calculateTReq(message_id, cmd.now),
        t_resp: manager.calculateTResp(sender_id, message_id, cmd.now),
        in_group: manager.isInResponseGroup(sender_id, message_id)
      }))
    };
  },
  async quit() {
    setImmediate(() => process.exit(0));
    return {};
  }
};

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  let response;
  try {
    const cmd = JSON.parse(line);
    if (cmd.now !== undefined) fakeNow = cmd.now;
    const handler = handlers[cmd.cmd];
    if (!handler) throw new Error(`unknown command ${cmd.cmd}`);
    response = { ok: true, ...(await handler(cmd)) };
  } catch (error) {
    response = { ok: false, error: String(error?.stack ?? error) };
  }
  process.stdout.write(JSON.stringify(response) + "\n");
}
