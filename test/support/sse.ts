// A streamed /v1/completions as a client sees it: the text, the gguf_mesh telemetry events that
// rode on the chunks, and any `event: error` — with a callback after each text chunk, so a test
// can inject a fault mid-stream.
export interface Streamed {
  text: string;
  /** gguf_mesh extension events (stage_lost, route_repaired, step_timing, …) */
  events: any[];
  /** bodies of `event: error` messages */
  errors: any[];
  chunks: number;
}

export async function streamCompletion(base: string, secret: string, body: Record<string, unknown>, onChunk: (n: number) => void = () => undefined): Promise<Streamed> {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  const out: Streamed = { text: '', events: [], errors: [], chunks: 0 };
  await readSse(res, ({ event, data }) => {
    if (event === 'error') out.errors.push(JSON.parse(data));
    if (event || data === '[DONE]') return;
    const chunk = JSON.parse(data);
    if (chunk.gguf_mesh?.type) out.events.push(chunk.gguf_mesh);
    const text = chunk.choices?.[0]?.text ?? '';
    if (text) {
      out.text += text;
      onChunk(++out.chunks);
    }
  });
  return out;
}

/** Reads a server-sent-events body to its end, one `{event?, data, id?}` message at a time. */
export async function readSse(res: Response, onMessage: (m: { event?: string; data: string; id?: string }) => void): Promise<void> {
  const reader = res.body!.getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += new TextDecoder().decode(value);
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const event = /^event: (.*)$/m.exec(block)?.[1];
      const data = /^data: (.*)$/m.exec(block)?.[1] ?? '';
      const id = /^id: (.*)$/m.exec(block)?.[1];
      onMessage({ ...(event ? { event } : {}), data, ...(id !== undefined ? { id } : {}) });
    }
  }
}
