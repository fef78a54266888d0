// Runs an ONNX model with ONNX Runtime (the npm package onnxruntime-node,
// installed by scripts/bootstrap) for the worker's reference tests:
//   node ort_run.js MODEL OUTDIR NAME DIMS FILE [NAME DIMS FILE...]
// Each input is raw little-endian float32 in FILE with DIMS "D0xD1x...";
// output K (in the model's order) is written to OUTDIR/output_K.f32, and
// its dims to OUTDIR/output_K.dims (one line, "D0 D1 ...").
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

async function main(argv)
{
    if (argv.length < 5 || (argv.length - 2) % 3 !== 0)
        throw new Error('usage: ort_run.js MODEL OUTDIR NAME DIMS FILE [NAME DIMS FILE...]');
    const [model, outdir, ...specs] = argv;
    // One thread and no graph rewrites: the reference is ORT's plain kernels.
    const session = await ort.InferenceSession.create(model, {
        intraOpNumThreads: 1,
        interOpNumThreads: 1,
        graphOptimizationLevel: 'disabled',
        logSeverityLevel: 3,
    });
    const feeds = {};
    for (let i = 0; i < specs.length; i += 3) {
        const [name, dims, file] = specs.slice(i, i + 3);
        const shape = dims.split('x').map(Number);
        const buf = fs.readFileSync(file);
        const data = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
        feeds[name] = new ort.Tensor('float32', Float32Array.from(data), shape);
    }
    const result = await session.run(feeds);
    session.outputNames.forEach((name, k) => {
        const t = result[name];
        if (t.type !== 'float32')
            throw new Error(`output ${name} is ${t.type}, not float32`);
        fs.writeFileSync(path.join(outdir, `output_${k}.f32`), Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
        fs.writeFileSync(path.join(outdir, `output_${k}.dims`), t.dims.join(' ') + '\n');
    });
}

main(process.argv.slice(2)).catch((e) => {
    process.stderr.write(`ort_run: ${e.message}\n`);
    process.exit(1);
});
