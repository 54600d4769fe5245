//! CUDA graphs of whole passes, captured on a shape's second sight and replayed after.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, CudaStream, sys};

use super::CudaError;

/// Passes of at most this many rows are captured as CUDA graphs: decoding steps and
/// drafts, whose shapes recur; prefill chunks and large batches vary too much to pay back
/// a capture.
const GRAPH_MAX_ROWS: usize = 128;
/// Graphs kept before the cache starts over.
const GRAPH_CACHE: usize = 256;

/// A pass shape: (rows, rows with logits, generation of the scratch buffers).
pub(super) type PassShape = (usize, usize, u64);

/// CUDA graphs of whole passes, by shape. A pass of a shape seen before is captured
/// once and replayed after: one launch instead of five per layer, which on a one-row
/// step is most of its time on the host. `SUFFIXD_CUDA_GRAPHS=off` turns them off;
/// `SUFFIXD_CUDA_GRAPH_AFTER=N` captures a shape on its Nth sight (default 2): under
/// load, where row counts vary, a capture pays back only on shapes that recur.
pub(super) struct Graphs {
    enabled: bool,
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
            capture_after: super::env_u32("SUFFIXD_CUDA_GRAPH_AFTER", &|n| (1..=1000).contains(&n))
                .unwrap_or(2),
            seen: Default::default(),
            ready: Default::default(),
        }
    }
}

impl Graphs {
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
        match Self::capture(stream, &launch) {
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

    /// The launches of `launch`, recorded on `stream` rather than run.
    fn capture(
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
}
