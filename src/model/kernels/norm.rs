//! The forward pass's per-row element-wise steps on the host: RMS normalization, the
//! residual addition and interleaved rotary embeddings.
//!
//! Each row's result depends on that row alone, through the same operations in the same
//! order whatever the row count. Plain Rust arithmetic with no target features and no
//! fused multiply-adds, so every CPU gives the same bits, and the compiler vectorizes
//! the loops where it can.

use super::reduce_lanes;

/// `out[r] = x[r] / rms(x[r]) · weight` for each row of `x` (`rows × weight.len()`),
/// with `rms(v) = sqrt(mean(v²) + eps)` as llama defines it. The squares are summed in
/// eight lanes and reduced in the kernels' fixed order.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    let width = weight.len();
    assert!(
        width > 0 && x.len().is_multiple_of(width),
        "x is rows × weight.len()"
    );
    out.clear();
    out.resize(x.len(), 0.0);
    for (row, out) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let mut lanes = [0f32; 8];
        let mut chunks = row.chunks_exact(8);
        for chunk in &mut chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane += v * v;
            }
        }
        for (lane, &v) in lanes.iter_mut().zip(chunks.remainder()) {
            *lane += v * v;
        }
        let rms = (reduce_lanes(&lanes) / width as f32 + eps).sqrt();
        for ((o, &v), &w) in out.iter_mut().zip(row).zip(weight) {
            *o = v / rms * w;
        }
    }
}

/// `x += y`, element by element: the residual connection.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "the same shape");
    for (x, &y) in x.iter_mut().zip(y) {
        *x += y;
    }
}

/// The heads in columns `from..from + heads · head_dim` of `rows` rows of `x` (`stride`
/// floats per row), gathered head-major into `out` (`[head][row][head_dim]`). With
/// `rotary`, each head's value pairs (2i, 2i + 1) are rotated by the angle of the row's
/// position, `cos` and `sin` giving `head_dim / 2` values per position (RoPE with
/// adjacent pairs, as GGUF lays out q and k).
#[allow(clippy::too_many_arguments)]
pub fn gather_heads(
    x: &[f32],
    stride: usize,
    from: usize,
    heads: usize,
    head_dim: usize,
    rotary: Option<(&[u32], &[f32], &[f32])>,
    out: &mut Vec<f32>,
) {
    let rows = x.len() / stride;
    assert_eq!(x.len(), rows * stride, "x is rows × stride");
    assert!(
        from + heads * head_dim <= stride,
        "the heads are inside a row"
    );
    assert!(head_dim.is_multiple_of(2), "head_dim is even");
    out.clear();
    out.resize(heads * rows * head_dim, 0.0);
    let half = head_dim / 2;
    for (r, row) in x.chunks_exact(stride).enumerate() {
        for h in 0..heads {
            let src = &row[from + h * head_dim..][..head_dim];
            let dst = &mut out[(h * rows + r) * head_dim..][..head_dim];
            match rotary {
                None => dst.copy_from_slice(src),
                Some((positions, cos, sin)) => {
                    let at = positions[r] as usize * half;
                    let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
                    for (((d, s), &c), &s_) in dst
                        .chunks_exact_mut(2)
                        .zip(src.chunks_exact(2))
                        .zip(cos)
                        .zip(sin)
                    {
                        d[0] = s[0] * c - s[1] * s_;
                        d[1] = s[0] * s_ + s[1] * c;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::test_values as values;
    use candle_core::{Device, Tensor};

    #[test]
    fn rms_norm_matches_candle_s() {
        let (rows, width) = (5, 576);
        let x = values(rows * width, 3, 4.0);
        let w = values(width, 4, 2.0);
        let mut ours = Vec::new();
        rms_norm(&x, &w, 1e-5, &mut ours);
        let dev = Device::Cpu;
        let theirs: Vec<f32> = candle_nn::ops::rms_norm(
            &Tensor::from_vec(x.clone(), (rows, width), &dev).unwrap(),
            &Tensor::from_vec(w, width, &dev).unwrap(),
            1e-5,
        )
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
        // A row alone gets the bits it gets among others.
        let mut alone = Vec::new();
        rms_norm(
            &x[2 * width..3 * width],
            &values(width, 4, 2.0),
            1e-5,
            &mut alone,
        );
        assert_eq!(alone, ours[2 * width..3 * width]);
    }

    #[test]
    fn gathered_heads_match_candle_s_interleaved_rope() {
        let (rows, heads, hd) = (3, 4, 8);
        let stride = heads * hd + 5;
        let x = values(rows * stride, 7, 2.0);
        let positions = [4u32, 0, 9];
        let table = |seed| values(10 * hd / 2, seed, 2.0);
        let (cos, sin) = (table(8), table(9));
        let mut ours = Vec::new();
        gather_heads(
            &x,
            stride,
            5,
            heads,
            hd,
            Some((&positions, &cos, &sin)),
            &mut ours,
        );
        let dev = Device::Cpu;
        let xs = Tensor::from_vec(x.clone(), (rows, stride), &dev).unwrap();
        let heads_t = xs
            .narrow(1, 5, heads * hd)
            .unwrap()
            .reshape((1, rows, heads, hd))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        let pick = |t: Vec<f32>| {
            let t = Tensor::from_vec(t, (10, hd / 2), &dev).unwrap();
            let ids = Tensor::new(&positions, &dev).unwrap();
            t.index_select(&ids, 0).unwrap().contiguous().unwrap()
        };
        let theirs: Vec<f32> =
            candle_nn::rotary_emb::rope_i(&heads_t, &pick(cos.clone()), &pick(sin.clone()))
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
        assert_eq!(ours, theirs);
        let mut plain = Vec::new();
        gather_heads(&x, stride, 5, heads, hd, None, &mut plain);
        let plain_t: Vec<f32> = heads_t.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(plain, plain_t);
    }
}
