// Times an ONNX model in ONNX Runtime (npm onnxruntime-node, which
// scripts/bootstrap --test installs into third_party/npm), for
// bench/ort_ab.py: the same file, batch, threads and timed iterations as
// squish-cpu-bench, one JSON line on stdout.
//   node ort_bench.js MODEL.onnx BATCH THREADS ITERS WARMUP HW
'use strict';
const ort = require('onnxruntime-node');

function median(v)
{
    const s = [...v].sort((a, b) => a - b);
    return s[Math.floor(s.length / 2)];
}

async function main(argv)
{
    const [model, batch, threads, iters, warmup, hw] = argv;
    // Its defaults, as a user who compares would run it: every graph
    // optimization, threads as asked.
    const session = await ort.InferenceSession.create(model, {
        intraOpNumThreads: Number(threads),
        interOpNumThreads: 1,
        graphOptimizationLevel: 'all',
        executionMode: 'sequential',
        logSeverityLevel: 3,
    });
    const n = Number(batch), side = Number(hw);
    const data = new Float32Array(n * 3 * side * side);
    let x = 12345;
    for (let i = 0; i < data.length; i++) {
        x = (1103515245 * x + 12345) >>> 0;
        data[i] = (x % 1000) / 1000;
    }
    const feeds = {[session.inputNames[0]]: new ort.Tensor('float32', data, [n, 3, side, side])};
    for (let i = 0; i < Number(warmup); i++)
        await session.run(feeds);
    const ms = [];
    const cpu0 = process.cpuUsage();
    for (let i = 0; i < Number(iters); i++) {
        const t = process.hrtime.bigint();
        await session.run(feeds);
        ms.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
    const cpu = process.cpuUsage(cpu0);
    const med = median(ms);
    process.stdout.write(JSON.stringify({
        engine: 'ort', batch: n, threads: Number(threads), median_ms: med,
        min_ms: Math.min(...ms), images_per_s: n * 1000 / med,
        cpu_ms: (cpu.user + cpu.system) / 1000 / Number(iters),
    }) + '\n');
}

main(process.argv.slice(2)).catch((e) => {
    process.stderr.write(`ort_bench: ${e.message}\n`);
    process.exit(1);
});
