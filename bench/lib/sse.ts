// Reads an OpenAI-style server-sent event stream: each `data:` JSON chunk to `onChunk` as it
// arrives, until `[DONE]` or the end; an `event: error` block throws.
export async function readSseJson(res: Response, onChunk: (chunk: any) => void): Promise<void> {
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      const data = /^data: (.*)$/m.exec(block)?.[1] ?? '';
      buf = buf.slice(i + 2);
      if (/^event: error$/m.test(block)) throw new Error(`the stream failed: ${data}`);
      if (data && data !== '[DONE]') onChunk(JSON.parse(data));
    }
  }
}
