//! CUDA graphs of whole passes, captured on a shape's second sight and replayed after.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, CudaStream, sys};

use super::error::CudaError;

/// Passes of at most this many rows are captured as CUDA graphs: decoding steps, drafts,
/// prefill chunks (256 rows) and a loaded server's batches of them. Above 16 rows, passes
/// are padded to a few sizes ([`padded_rows`]) so that their shapes recur.
const GRAPH_MAX_ROWS: usize = 512;
/// Graphs kept before the cache starts over (36 row counts, and as many head-row counts
/// at most each).
pub(super) const GRAPH_CACHE: usize = 512;
/// The most rows padding adds to a pass.
pub(super) const PADDING_MAX: usize = 31;

/// The rows a pass of `rows` runs as, padding included: as many up to 16 (a tensor-core
/// tile of 16 rows costs what one row does, and single-stream steps keep their exact
/// shapes), a multiple of 16 up to 128 and of 32 up to [`GRAPH_MAX_ROWS`]; more rows
/// run as they are, kernel by kernel. At most [`PADDING_MAX`] rows more, and for a pass
/// of 139 rows (a loaded server's) 15% more rows, where launching its 150 kernels one
/// by one took 3.3 ms against a graph's 1.9 ms (docs/gpu.md).
pub(super) fn padded_rows(rows: usize) -> usize {
    match rows {
        0..=16 => rows,
        17..=128 => rows.next_multiple_of(16),
        129..=GRAPH_MAX_ROWS => rows.next_multiple_of(32),
        _ => rows,
    }
}

/// A pass shape: (rows, rows with logits, generation of the scratch buffers).
pub(super) type PassShape = (usize, usize, u64);

/// CUDA graphs of whole passes, by shape. A pass of a shape seen before is captured
/// once and replayed after: one launch instead of five per layer, which on a one-row
/// step is most of its time on the host. `SUFFIXD_CUDA_GRAPHS=off` turns them off (and
/// the padding with them); `SUFFIXD_CUDA_GRAPH_AFTER=N` captures a shape on its Nth
/// sight (default 2): under load, where row counts vary, a capture pays back only on
/// shapes that recur.
pub(super) struct Graphs {
    enabled: bool,
    /// Passes are padded to [`padded_rows`] (`SUFFIXD_CUDA_PAD=off`: not).
    pad: bool,
    capture_after: u32,
    seen: std::collections::HashMap<PassShape, u32>,
    ready: std::collections::HashMap<PassShape, SendGraph>,
}

/// A captured graph. CUDA graphs may be used from any thread when calls on them are
/// serialised, which the scratch mutex does.
struct SendGraph(CudaGraph);
// SAFETY: see above: only used under `CudaForward::scratch`'s lock.
unsafe impl Send for SendGraph {}

impl Default for Graphs {
    fn default() -> Self {
        Graphs {
            enabled: !std::env::var("SUFFIXD_CUDA_GRAPHS").is_ok_and(|v| v == "off"),
            pad: !std::env::var("SUFFIXD_CUDA_PAD").is_ok_and(|v| v == "off"),
            capture_after: super::env_u32("SUFFIXD_CUDA_GRAPH_AFTER", &|n| (1..=1000).contains(&n))
                .unwrap_or(2),
            seen: Default::default(),
            ready: Default::default(),
        }
    }
}

impl Graphs {
    /// The rows a pass of `rows` runs as: [`padded_rows`] while graphs and padding are
    /// on, else `rows`.
    pub(super) fn padded(&self, rows: usize) -> usize {
        if self.enabled && self.pad {
            padded_rows(rows)
        } else {
            rows
        }
    }

    /// Forget every graph (they hold addresses about to be freed).
    pub(super) fn clear(&mut self) {
        self.ready.clear();
        self.seen.clear();
    }

    /// Run the pass `launch` makes, of shape `key`: replayed from its graph, captured on
    /// its second sight, or launched one kernel at a time.
    pub(super) fn run(
        &mut self,
        stream: &Arc<CudaStream>,
        key: PassShape,
        launch: impl Fn() -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        if !self.enabled || key.0 > GRAPH_MAX_ROWS {
            return launch();
        }
        if let Some(graph) = self.ready.get(&key) {
            graph.0.launch()?;
            return Ok(());
        }
        let seen = self.seen.entry(key).or_insert(0);
        *seen += 1;
        if *seen < self.capture_after {
            return launch();
        }
        if self.ready.len() >= GRAPH_CACHE {
            self.ready.clear();
            self.seen.clear();
        }
        match capture(stream, &launch) {
            Ok(graph) => {
                graph.launch()?;
                self.ready.insert(key, SendGraph(graph));
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    "capturing a pass as a CUDA graph failed ({e}): passes are launched kernel by kernel from now on"
                );
                self.enabled = false;
                launch()
            }
        }
    }
}

/// The launches of `launch`, recorded on `stream` rather than run.
pub(super) fn capture(
    stream: &Arc<CudaStream>,
    launch: &impl Fn() -> Result<(), CudaError>,
) -> Result<CudaGraph, CudaError> {
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let launched = launch();
    // The capture ends whatever happened, so that the stream runs work again.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    launched?;
    graph?.ok_or_else(|| CudaError::Driver("the capture recorded no graph".into()))
}

#[cfg(test)]
mod tests {
    use super::{GRAPH_MAX_ROWS, PADDING_MAX, padded_rows};

    #[test]
    fn passes_pad_to_few_sizes_and_never_by_more_than_the_padding_cache() {
        let mut sizes = std::collections::BTreeSet::new();
        for rows in 0..=GRAPH_MAX_ROWS + 40 {
            let padded = padded_rows(rows);
            assert!(
                padded >= rows && padded - rows <= PADDING_MAX,
                "{rows} -> {padded}"
            );
            assert!(
                padded <= GRAPH_MAX_ROWS || padded == rows,
                "{rows} -> {padded}"
            );
            if rows <= GRAPH_MAX_ROWS {
                sizes.insert(padded);
            }
        }
        assert_eq!(sizes.len(), 17 + 7 + 12, "{sizes:?}");
        assert_eq!(padded_rows(1), 1);
        assert_eq!(padded_rows(139), 160);
    }
}
