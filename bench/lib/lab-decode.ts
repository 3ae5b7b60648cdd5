// `node bin/run-ts.js bench/lib/lab-decode.ts <join url> <prompt ids,…> <n> <rounds>`: bench wan's
// decode rounds (one-way and climbing token path) from wherever this runs — bench wan-lab runs it
// inside the server's namespace, which the bench process itself cannot reach. Prints one JSON line.
import { joinRoom } from '../../src/route/remote.ts';
import { trustRoomServer } from '../../src/transport/tls-trust.ts';
import { decodeRounds } from '../wan.ts';

const [joinUrl, prompt, n, rounds] = process.argv.slice(2);
await trustRoomServer(joinUrl!); // an https link (bench wan-lab --stages tab): the CA its fingerprint pins, as generate --join does
const joined = await joinRoom(joinUrl!, undefined, 60_000);
try {
  console.log(JSON.stringify(await decodeRounds(joined, prompt!.split(',').map(Number), Number(n), Number(rounds))));
} finally {
  await joined.close();
}
