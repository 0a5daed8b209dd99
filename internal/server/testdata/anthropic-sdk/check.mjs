// Runs the official Anthropic TypeScript SDK against kvroute serve
// (TestMessagesWithAnthropicSDK): a message, a streamed message that
// continues the conversation, and an error; prints what the SDK made of
// them as one JSON object for the Go test to check.
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.env.KVROUTE_URL, apiKey: process.env.KVROUTE_KEY, maxRetries: 0 });
const model = process.env.KVROUTE_MODEL;
const system = "You are a careful assistant for a cache-aware router. ".repeat(40);
const out = {};

const first = [{ role: "user", content: "What does a KV cache hold?" }];
const m1 = await client.messages.create({ model, max_tokens: 12, system, messages: first, metadata: { user_id: "sdk-user" } });
out.created = { id: m1.id, type: m1.type, role: m1.role, text: m1.content.map((b) => b.text).join(""),
  stop_reason: m1.stop_reason, usage: m1.usage };

const second = [...first, { role: "assistant", content: out.created.text }, { role: "user", content: "And why route by it?" }];
const stream = client.messages.stream({ model, max_tokens: 12, system, messages: second, metadata: { user_id: "sdk-user" } });
const events = [];
let text = "";
for await (const ev of stream) {
  events.push(ev.type);
  if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") text += ev.delta.text;
}
const m2 = await stream.finalMessage();
out.streamed = { events, text, final_text: m2.content.map((b) => b.text).join(""), stop_reason: m2.stop_reason, usage: m2.usage };

try {
  await client.messages.create({ model: "no-such-model", max_tokens: 4, messages: first });
  out.error = { thrown: false };
} catch (e) {
  out.error = { thrown: true, status: e.status, not_found: e instanceof Anthropic.NotFoundError, type: e.error?.error?.type };
}
console.log(JSON.stringify(out));
