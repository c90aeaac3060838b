// Cross-implementation check for Chorus's RIBLT: reads one JSON request on stdin,
// runs @peerbit/riblt (the Rust `riblt` crate compiled to WebAssembly; items are u64,
// checksums SipHash-2-4 with keys 123, 456) and prints one JSON answer on stdout.
//   {"encode": {"items": ["1", ...], "count": N}}
//     -> {"symbols": [["sum", "checksum", "count"], ...]}     (decimal strings)
//   {"decode": {"items": [...], "symbols": [[...], ...]}}
//     -> {"decoded": bool, "remote": [...], "local": [...], "used": K}
import { ready, EncoderWrapper, DecoderWrapper } from "@peerbit/riblt";

await ready;
let input = "";
for await (const chunk of process.stdin) input += chunk;
const request = JSON.parse(input);
let answer;
if (request.encode) {
  const encoder = new EncoderWrapper();
  for (const item of request.encode.items) encoder.add_symbol(BigInt(item));
  const symbols = [];
  for (let i = 0; i < request.encode.count; i++) {
    const s = encoder.produce_next_coded_symbol();
    symbols.push([s.symbol.toString(), s.hash.toString(), s.count.toString()]);
  }
  answer = { symbols };
} else if (request.decode) {
  const decoder = new DecoderWrapper();
  for (const item of request.decode.items) decoder.add_symbol(BigInt(item));
  let used = 0;
  for (const [symbol, hash, count] of request.decode.symbols) {
    decoder.add_coded_symbol({ symbol: BigInt(symbol), hash: BigInt(hash), count: BigInt(count) });
    used += 1;
    decoder.try_decode();
    if (decoder.decoded()) break;
  }
  answer = {
    decoded: decoder.decoded(),
    used,
    remote: decoder.get_remote_symbols().map((x) => x.toString()),
    local: decoder.get_local_symbols().map((x) => x.toString()),
  };
} else {
  throw new Error("unknown request");
}
process.stdout.write(JSON.stringify(answer) + "\n");
