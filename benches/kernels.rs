//! The row-invariant CPU kernels alone: the quantized matmul for each packed format and
//! the f32 one, at 1, 4, 16 and 64 rows, on the default model's down projection
//! (1,536 → 576; the K-quants need inputs in whole 256-value blocks) and, for Q8_0 and
//! Q4_1, on its gate projection (576 → 1,536), also with its weights streamed from
//! memory; and host attention of 1 and 16 queries over 1,024
//! cached positions with 9 query and 3 key/value heads.
//!
//! `cargo bench --bench kernels`; compare medians within one run. The cost of K rows
//! against one is the figure that matters: t(K)/t(1) here is the kernel's share of the
//! verifier's cost curve (`tools/verify-cost.sh` measures the whole forward pass).

use std::hint::black_box;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use suffixd::model::kernels::Simd;
use suffixd::model::kernels::attention::{AttnShape, SequenceCache, attend};
use suffixd::model::kernels::dense::{DenseMatrix, matmul_dense};
use suffixd::model::kernels::matmul::{QuantizedRows, matmul};
use suffixd::model::kernels::pack::PackedMatrix;

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// The quantized matmul of an `(n, k)` matrix of `w` in each of `formats`, at 1 to 64
/// rows, into `group` (activations quantized inside the timed loop, as a pass does).
fn packed_matmuls(
    group: &mut BenchmarkGroup<'_, WallTime>,
    w: &[f32],
    (n, k): (usize, usize),
    formats: &[GgmlDType],
) {
    let simd = Simd::detect();
    for &dtype in formats {
        let t = Tensor::from_vec(w.to_vec(), (n, k), &Device::Cpu).unwrap();
        let packed = PackedMatrix::from_qtensor(&QTensor::quantize(&t, dtype).unwrap()).unwrap();
        for rows in [1, 4, 16, 64] {
            let x = values(rows * k, 2);
            let mut a = QuantizedRows::default();
            let mut out = vec![0f32; rows * n];
            group.bench_function(format!("{dtype:?}/rows={rows}"), |b| {
                b.iter(|| {
                    a.quantize(black_box(&x), rows, k);
                    matmul(simd, std::slice::from_ref(&packed), &a, &mut out);
                    black_box(&out);
                })
            });
        }
    }
}

fn matmuls(c: &mut Criterion) {
    let (n, k) = (576, 1536);
    let w = values(n * k, 1);
    let simd = Simd::detect();
    let mut group = c.benchmark_group("matmul_1536x576");
    let formats = [
        GgmlDType::Q8_0,
        GgmlDType::Q4_1,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ];
    packed_matmuls(&mut group, &w, (n, k), &formats);
    let dense = DenseMatrix::new(n, k, w.clone());
    for rows in [1, 4, 16, 64] {
        let x = values(rows * k, 2);
        let mut out = vec![0f32; rows * n];
        group.bench_function(format!("F32/rows={rows}"), |b| {
            b.iter(|| {
                matmul_dense(
                    simd,
                    std::slice::from_ref(&dense),
                    black_box(&x),
                    rows,
                    &mut out,
                );
                black_box(&out);
            })
        });
    }
    group.finish();
    // The default model's other shape: q, k, v, o, gate and up take 576 inputs, 18
    // blocks, which a kernel working in groups of blocks ends on a short group.
    let (n, k) = (1536, 576);
    let mut group = c.benchmark_group("matmul_576x1536");
    packed_matmuls(
        &mut group,
        &values(n * k, 3),
        (n, k),
        &[GgmlDType::Q8_0, GgmlDType::Q4_1],
    );
    group.finish();
    streamed(c);
}

/// The gate projection's shape again, but cycling through 64 copies of the matrix (42 MB
/// in Q4_1, more than the caches hold), so each multiply streams its weights from memory
/// as a forward pass does; time per matrix. Against `matmul_576x1536`, whose one matrix
/// stays in L2, it separates what memory costs from what the kernel costs. (Session 30,
/// one run, two threads, one row: 24.1 µs streamed against 21.8 µs in L2. So a one-row
/// pass is not bound by bandwidth, 27 of the 46 GB/s this machine streams: each column
/// pair's 1,152 multiply-adds cost about 57 ns of a thread, mostly fixed cost.)
fn streamed(c: &mut Criterion) {
    const COPIES: usize = 64;
    let (n, k) = (1536, 576);
    let simd = Simd::detect();
    let t = Tensor::from_vec(values(n * k, 3), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, GgmlDType::Q4_1).unwrap();
    let copies: Vec<PackedMatrix> = (0..COPIES)
        .map(|_| PackedMatrix::from_qtensor(&q).unwrap())
        .collect();
    let mut group = c.benchmark_group("matmul_576x1536_streamed");
    for rows in [1, 4, 16] {
        let x = values(rows * k, 2);
        let mut a = QuantizedRows::default();
        let mut out = vec![0f32; rows * n];
        let mut next = 0;
        group.bench_function(format!("Q4_1/rows={rows}"), |b| {
            b.iter(|| {
                a.quantize(black_box(&x), rows, k);
                matmul(simd, std::slice::from_ref(&copies[next]), &a, &mut out);
                next = (next + 1) % COPIES;
                black_box(&out);
            })
        });
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let (heads, kv_heads, hd, base) = (9, 3, 64, 1024);
    let mut group = c.benchmark_group("attention_ctx1024");
    for t in [1usize, 16] {
        let q = values(heads * t * hd, 3);
        let keys = values((base + t) * kv_heads * hd, 4);
        let vals = values((base + t) * kv_heads * hd, 5);
        let sets: Vec<Vec<usize>> = (0..t).map(|i| (0..=i).collect()).collect();
        let mut out = vec![0f32; t * heads * hd];
        let shape = AttnShape::full(t, heads, kv_heads, hd);
        let seq = SequenceCache {
            keys: &keys,
            values: &vals,
            sets: &sets,
            base,
            offset: 0,
        };
        group.bench_function(format!("queries={t}"), |b| {
            b.iter(|| {
                attend(Simd::detect(), &q, &[seq], shape, &mut out);
                black_box(&out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, matmuls, attention);
criterion_main!(benches);
