// The official Ollama JavaScript client (npm "ollama") against model-boss: run by
// tests/e2e/test_ollama_api.py with OLLAMA_HOST set; prints what it saw as one JSON line.
import { Ollama } from 'ollama'
const ollama = new Ollama({ host: process.env.OLLAMA_HOST })
const out = {}
const r = await ollama.chat({ model: 'smollm2:135m', messages: [{ role: 'user', content: 'Say hello.' }], options: { num_predict: 4 } })
out.chat = { content: r.message.content, done: r.done, eval_count: r.eval_count }
let pieces = [], last
for await (const part of await ollama.generate({ model: 'smollm2:135m', prompt: 'Hi', stream: true, options: { num_predict: 4 } })) { pieces.push(part.response); last = part }
out.stream = { text: pieces.join(''), done: last.done, done_reason: last.done_reason, eval_count: last.eval_count }
out.embed = (await ollama.embed({ model: 'smol-embed', input: 'a cat' })).embeddings[0].length
out.tags = (await ollama.list()).models.map(m => m.name)
out.ps = (await ollama.ps()).models.map(m => [m.name, m.size_vram > 0, m.expires_at])
try { await ollama.chat({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }) } catch (e) { out.missing = [e.status_code, e.error] }
try { await ollama.pull({ model: 'llama3' }) } catch (e) { out.pull = [e.status_code, e.error] }
console.log(JSON.stringify(out))
