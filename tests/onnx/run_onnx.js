// Runs an exported .onnx model in ONNX Runtime (npm's onnxruntime-node, CPU) and compares its
// outputs with localpar's own: node run_onnx.js MODEL INPUT.npy EXPECTED.npy [LABELS.npy]
// INPUT holds the model's inputs (float32, or int64 token ids); EXPECTED localpar predict's
// --logits output; LABELS (int64, one per row) adds how many rows ONNX Runtime gets right.
// Prints the figures as one JSON line and exits 1 when they miss the bar: max |difference|
// <= 1e-4 and the same argmax on >= 99.9% of rows.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function readNpy(path) {
  const b = fs.readFileSync(path);
  if (b.toString('latin1', 0, 6) !== '\x93NUMPY') throw new Error(`${path}: not .npy`);
  const major = b[6];
  const hlen = major === 1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const at = major === 1 ? 10 : 12;
  const header = b.toString('latin1', at, at + hlen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',')
      .map((s) => s.trim()).filter((s) => s.length).map(Number);
  const data = b.subarray(at + hlen);
  const copy = new Uint8Array(data.length);
  copy.set(data);
  let values;
  if (descr === '<f4') values = new Float32Array(copy.buffer);
  else if (descr === '<i8') values = new BigInt64Array(copy.buffer);
  else throw new Error(`${path}: dtype ${descr}`);
  return {shape, values};
}

async function main() {
  const [model, inputPath, expectedPath, labelsPath] = process.argv.slice(2);
  const input = readNpy(inputPath);
  const expected = readNpy(expectedPath);
  const labels = labelsPath ? readNpy(labelsPath).values : null;
  const session = await ort.InferenceSession.create(model, {intraOpNumThreads: 1});
  const type = input.values instanceof BigInt64Array ? 'int64' : 'float32';
  const n = input.shape[0];
  const per = input.values.length / n;
  const classes = expected.shape[expected.shape.length - 1];
  const outPer = expected.values.length / n;
  const batch = 500;
  let maxDiff = 0, rows = 0, same = 0, correct = 0;
  for (let begin = 0; begin < n; begin += batch) {
    const m = Math.min(batch, n - begin);
    const slice = input.values.subarray(begin * per, (begin + m) * per);
    const feeds = {input: new ort.Tensor(type, slice, [m, ...input.shape.slice(1)])};
    const out = (await session.run(feeds)).logits.data;
    if (out.length !== m * outPer) throw new Error(`logits: ${out.length} values, want ${m * outPer}`);
    for (let r = 0; r < out.length / classes; ++r) {
      let a = 0, e = 0;
      for (let c = 0; c < classes; ++c) {
        const got = out[r * classes + c];
        const want = expected.values[begin * outPer + r * classes + c];
        maxDiff = Math.max(maxDiff, Math.abs(got - want));
        if (got > out[r * classes + a]) a = c;
        if (want > expected.values[begin * outPer + r * classes + e]) e = c;
      }
      if (labels) correct += BigInt(a) === labels[rows] ? 1 : 0;
      rows += 1;
      same += a === e ? 1 : 0;
    }
  }
  const agree = same / rows;
  console.log(JSON.stringify({model, rows, max_abs_diff: maxDiff, argmax_agreement: agree, correct}));
  if (!(maxDiff <= 1e-4) || agree < 0.999) process.exit(1);
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(2);
});
