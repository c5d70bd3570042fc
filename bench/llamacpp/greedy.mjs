// greedy.mjs - load a GGUF in llama.cpp (node-llama-cpp 3.21.1, CPU only, no download at run
// time) and print a greedy completion: the check that llama.cpp loads what `kvcache model
// synth` writes, and the reference text for a model's greedy output.
//   cd bench/llamacpp && npm ci && node greedy.mjs MODEL.gguf "PROMPT" [N_TOKENS]
import {getLlama, LlamaCompletion} from "node-llama-cpp";

const [modelPath, prompt = "", n = "32"] = process.argv.slice(2);
if (!modelPath) {
    console.error("usage: node greedy.mjs MODEL.gguf PROMPT [N_TOKENS]");
    process.exit(2);
}
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({contextSize: 256});
const completion = new LlamaCompletion({contextSequence: ctx.getSequence()});
const text = await completion.generateCompletion(prompt, {maxTokens: Number(n), temperature: 0});
console.log(JSON.stringify({model: modelPath, tensors: model.fileInfo.tensorInfo?.length, text}));
