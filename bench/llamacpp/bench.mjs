// bench.mjs - llama.cpp's side of the engine benchmark (bench/engine/run.py): one measurement per
// run, on a GGUF and a list of token ids the driver chose, printed as one JSON line.
//   node bench.mjs JOB.json                one job, one line
//   node bench.mjs --serve MODEL.gguf      jobs as JSON lines on stdin, one result line each
//                                          (the model loaded once; every job its own context)
// JOB: {"model": FILE, "threads": T, "mode": M, "flash_attention": true|false|"auto", ...}
//   ("model" only in the one-job form; a job that fails answers {"error": MESSAGE})
//   info    {}                                    llama.cpp's release, build and CPU features
//   pp      {"ids": [...]}                        prompt processing: tokens/s of one batch pass
//   tg      {"ids": [...], "n": N}                greedy generation of N tokens after the prompt:
//                                                 time per token from the first generated token on
//   ctx     same as tg; the prompt fills the context to the length under test
//   agg     {"prompts": [[...], ...], "n": N}     N tokens for every prompt, all sequences at once
//                                                 (one context, `sequences: P`, batched per step)
//   agg_decode  as agg, but no sampling: each step feeds every sequence one given id (the
//                                                 decode rate agg would reach at no sampling cost)
//   shared  {"prompts": [...], "n": N, "share": false|true}
//                                                 wall time for all; share: the common prompt is
//                                                 evaluated once in sequence 0 and its state copied
//                                                 into the others through llama.cpp's sequence
//                                                 state files (node-llama-cpp exposes no seq_cp)
// Greedy everywhere (temperature 0, no penalties); the end-of-generation token does not stop a
// sequence (evaluate() yields tokens until its caller stops), so every side generates N tokens.
import {getLlama} from "node-llama-cpp";
import {createInterface} from "node:readline";
import {cpus} from "node:os";
import {readFileSync, mkdtempSync, rmSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";

const now = () => Number(process.hrtime.bigint()) / 1e9;

const serve = process.argv[2] === "--serve";
const first = serve ? null : JSON.parse(readFileSync(process.argv[2], "utf8"));
const modelPath = serve ? process.argv[3] : first.model;
if (!modelPath) {
    console.error("usage: node bench.mjs JOB.json | node bench.mjs --serve MODEL.gguf");
    process.exit(2);
}
const llama = await getLlama({gpu: false, build: "never", logLevel: "error",
                              maxThreads: cpus().length});
const model = await llama.loadModel({modelPath, useMlock: false});
let threads = 1, fa = true;

async function makeContext(sequences, tokensPerSeq, batchSize) {
    return model.createContext({
        sequences,
        contextSize: tokensPerSeq,
        batchSize,
        flashAttention: fa,
        threads: {ideal: threads, min: threads},
    });
}

// Evaluates ids, then generates n tokens greedily; returns the generated ids and the time of each.
async function generate(seq, ids, n) {
    const out = [], at = [];
    if (n <= 0) return {out, at};
    for await (const tok of seq.evaluate(ids, {temperature: 0})) {
        out.push(tok);
        at.push(now());
        if (out.length >= n) break;
    }
    return {out, at};
}

const tpot = (at) => (at.length > 1 ? (at[at.length - 1] - at[0]) / (at.length - 1) : null);

async function runJob(job) {
    threads = job.threads;
    fa = job.flash_attention ?? true;
    let result, ctx = null;
    try {
        if (job.mode === "info") {
            result = {llama_cpp: llama.llamaCppRelease, build: llama.buildType,
                      system_info: llama.systemInfo, node_llama_cpp: "3.21.1"};
        } else if (job.mode === "pp") {
            ctx = await makeContext(1, job.ids.length + 16, job.ids.length);
            const seq = ctx.getSequence();
            const t0 = now();
            await seq.evaluateWithoutGeneratingNewTokens(job.ids);
            const s = now() - t0;
            result = {tokens: job.ids.length, seconds: s, tok_s: job.ids.length / s};
        } else if (job.mode === "tg" || job.mode === "ctx") {
            ctx = await makeContext(1, job.ids.length + job.n + 16, job.batch_size ?? 512);
            const seq = ctx.getSequence();
            const t0 = now();
            const {out, at} = await generate(seq, job.ids, job.n);
            const tp = tpot(at);
            result = {prompt_tokens: job.ids.length, completion_tokens: out.length,
                      ttft_s: at[0] - t0,
                      tpot_s: tp, tok_s: tp ? 1 / tp : null, output_ids: out};
        } else if (job.mode === "agg_decode") {
            // llama.cpp's batched decode without sampling: each step feeds every sequence the
            // next of its given ids; what agg would reach if sampling and JS cost nothing.
            const P = job.prompts.length;
            const longest = Math.max(...job.prompts.map((p) => p.length));
            ctx = await makeContext(P, longest + job.n + 16, job.batch_size ?? 512);
            const seqs = Array.from({length: P}, () => ctx.getSequence());
            await Promise.all(seqs.map((s, i) => s.evaluateWithoutGeneratingNewTokens(job.prompts[i])));
            const t0 = now();
            for (let step = 0; step < job.n; step++)
                await Promise.all(seqs.map((s, i) =>
                    s.evaluateWithoutGeneratingNewTokens([job.prompts[i][(step % (job.prompts[i].length - 1)) + 1]])));
            const s = now() - t0;
            result = {sequences: P, steps: job.n, seconds: s, decode_tok_s: P * job.n / s};
        } else if (job.mode === "agg" || job.mode === "shared") {
            const P = job.prompts.length;
            const longest = Math.max(...job.prompts.map((p) => p.length));
            ctx = await makeContext(P, longest + job.n + 16, job.batch_size ?? 512);
            const seqs = Array.from({length: P}, () => ctx.getSequence());
            let dir = null, t_shared = 0;
            const t0 = now();
            let inputs = job.prompts;
            if (job.mode === "shared" && job.share) {
                // The prompts are all the same: evaluate all but its last token once, copy the state.
                const common = job.prompts[0].slice(0, -1);
                if (!job.prompts.every((p) => p.length === common.length + 1 &&
                                              p.slice(0, -1).every((t, i) => t === common[i])))
                    throw new Error("share: the prompts differ");
                await seqs[0].evaluateWithoutGeneratingNewTokens(common);
                dir = mkdtempSync(join(process.env.KVC_BENCH_STATE_DIR ?? tmpdir(), "kvc-nlc-"));
                const file = join(dir, "prefix.state");
                await seqs[0].saveStateToFile(file);
                for (let i = 1; i < P; i++) await seqs[i].loadStateFromFile(file, {acceptRisk: true});
                t_shared = now() - t0;
                inputs = job.prompts.map((p) => p.slice(-1));
            }
            const runs = await Promise.all(seqs.map((s, i) => generate(s, inputs[i], job.n)));
            const t1 = now();
            if (dir) rmSync(dir, {recursive: true, force: true});
            // Decode rate: tokens after each sequence's first, over the time from the last first token
            // (every prompt processed) to the last token.
            const firstAll = Math.max(...runs.map((r) => r.at[0]));
            const lastAll = Math.max(...runs.map((r) => r.at[r.at.length - 1]));
            const decoded = runs.reduce((a, r) => a + r.at.filter((t) => t > firstAll).length, 0);
            result = {sequences: P, completion_tokens: runs.reduce((a, r) => a + r.out.length, 0),
                      wall_s: t1 - t0, share_s: t_shared,
                      decode_tok_s: lastAll > firstAll ? decoded / (lastAll - firstAll) : null,
                      tok_s: runs.reduce((a, r) => a + r.out.length, 0) / (t1 - t0),
                      output_ids: runs.map((r) => r.out)};
        } else {
            throw new Error(`unknown mode ${job.mode}`);
        }
    } finally {
        if (ctx) await ctx.dispose();
    }
    result.mode = job.mode;
    result.threads = threads;
    result.flash_attention = fa;
    return result;
}

if (serve) {
    const lines = createInterface({input: process.stdin, crlfDelay: Infinity});
    for await (const line of lines) {
        if (!line.trim()) continue;
        let out;
        try {
            out = await runJob(JSON.parse(line));
        } catch (e) {
            out = {error: String(e && e.message || e)};
        }
        process.stdout.write(JSON.stringify(out) + "\n");
    }
} else {
    console.log(JSON.stringify(await runJob(first)));
}
await model.dispose();
await llama.dispose();
