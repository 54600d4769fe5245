//! What a forward pass costs as a function of the rows (tokens) it runs: t(K)/t(1).
//!
//! Measured once (`Engine::measure_cost_curve`; on a CPU the command line keeps it between
//! runs, `cli::cost_cache`) and then kept up to date from the
//! steps the engine actually runs. A server's steps are not the start-up probe: they batch
//! several sequences with their own caches, and the machine's load changes. Each step's
//! time, divided by what the start-up curve predicts for its row count, gives a correction
//! factor; a moving average of it is kept at the curve's points (shared between the two
//! points that bracket the step), and the curve in use is the measured one times the
//! corrections, renormalised to K = 1. A uniform slowdown of the machine therefore leaves
//! the ratios alone, while a change of shape (rows in a batch costing more than the probe
//! said) moves them.

/// Weight of the newest step in a point's moving average of corrections.
const RATE: f64 = 0.05;
/// One step's correction is clamped to this range, so that a hiccup (a descheduled thread
/// pool: 10× for one step) cannot swing the curve.
const CLAMP: (f64, f64) = (0.25, 4.0);
/// A point needs this much observed weight before its own correction is used; until then
/// it borrows from its observed neighbours.
const MIN_WEIGHT: f64 = 3.0;

/// The cost of one forward pass of K new tokens relative to one, t(K)/t(1).
#[derive(Clone, Debug, serde::Serialize)]
pub struct CostCurve {
    /// `(K, t(K)/t(1))` in use, K ascending, starting at (1, 1).
    pub points: Vec<(usize, f64)>,
    /// Milliseconds of one single-token step when measured.
    pub t1_ms: f64,
    /// The ratios measured at start, one per point.
    pub measured: Vec<f64>,
    /// Per point: the moving average of observed ÷ predicted step time, and the observed
    /// weight behind it (0 when no step of that size has run).
    pub corrections: Vec<(f64, f64)>,
    /// Steps observed since start.
    pub observed_steps: u64,
}

impl CostCurve {
    /// A curve from measured `(K, t(K)/t(1))` points and the time of one single-token step.
    /// With `t1_ms` of 0 the curve stays as given: steps do not correct it.
    pub fn new(points: Vec<(usize, f64)>, t1_ms: f64) -> Self {
        CostCurve {
            measured: points.iter().map(|p| p.1).collect(),
            corrections: vec![(1.0, 0.0); points.len()],
            points: convex(&points),
            t1_ms,
            observed_steps: 0,
        }
    }

    /// A curve that says verification is free (every draft is worth verifying).
    pub fn flat() -> Self {
        Self::new(vec![(1, 1.0), (64, 1.0)], 0.0)
    }

    /// A linear curve t(K)/t(1) = 1 + slope·(K − 1).
    pub fn linear(slope: f64) -> Self {
        Self::new(vec![(1, 1.0), (64, 1.0 + slope * 63.0)], 0.0)
    }

    /// t(K)/t(1), interpolated linearly (and extrapolated from the last two points).
    pub fn cost(&self, k: usize) -> f64 {
        interpolate(&self.points, k)
    }

    /// The curve as measured, `(K, t(K)/t(1))`, before any step corrected it.
    pub fn measured_points(&self) -> Vec<(usize, f64)> {
        self.points
            .iter()
            .map(|p| p.0)
            .zip(self.measured.iter().copied())
            .collect()
    }

    /// Learn from one forward pass of `rows` decoding rows that took `seconds`. Passes
    /// outside the measured range, and curves that were given rather than measured, teach
    /// nothing.
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        let last = self.points.last().map_or(0, |p| p.0);
        if self.t1_ms <= 0.0 || rows == 0 || rows > last || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let measured = self.measured_points();
        let predicted_ms = self.t1_ms * interpolate(&measured, rows);
        let c = (seconds * 1e3 / predicted_ms).clamp(CLAMP.0, CLAMP.1);
        // Share the step between the two points that bracket `rows`, by closeness.
        let hi = self
            .points
            .iter()
            .position(|p| p.0 >= rows)
            .unwrap_or(self.points.len() - 1);
        let lo = hi.saturating_sub(1);
        let (k_lo, k_hi) = (self.points[lo].0, self.points[hi].0);
        let w_hi = if k_hi == k_lo {
            1.0
        } else {
            (rows - k_lo) as f64 / (k_hi - k_lo) as f64
        };
        for (i, w) in [(lo, 1.0 - w_hi), (hi, w_hi)] {
            if w <= 0.0 {
                continue;
            }
            let (avg, weight) = &mut self.corrections[i];
            // The first observations count fully, so that the average starts from data.
            let rate = (w / (*weight + w)).max(RATE * w);
            *avg += rate * (c - *avg);
            *weight += w;
        }
        self.observed_steps += 1;
        self.refresh();
    }

    /// Recompute the ratios in use from the measured ones and the corrections.
    fn refresh(&mut self) {
        let known: Vec<(usize, f64)> = self
            .corrections
            .iter()
            .enumerate()
            .filter(|(_, c)| c.1 >= MIN_WEIGHT)
            .map(|(i, c)| (i, c.0))
            .collect();
        if known.is_empty() {
            return;
        }
        // Unobserved points take their correction from the observed ones around them:
        // interpolated between two, the nearest one's beyond the ends.
        let correction = |i: usize| -> f64 {
            let after = known.iter().position(|&(j, _)| j >= i);
            match after {
                Some(0) => known[0].1,
                None => known[known.len() - 1].1,
                Some(a) => {
                    let ((j0, c0), (j1, c1)) = (known[a - 1], known[a]);
                    if j1 == i {
                        c1
                    } else {
                        c0 + (c1 - c0) * (i - j0) as f64 / (j1 - j0) as f64
                    }
                }
            }
        };
        let base = self.measured[0] * correction(0);
        let mut previous = 1.0_f64;
        for i in 0..self.points.len() {
            let ratio = if i == 0 {
                1.0
            } else {
                (self.measured[i] * correction(i) / base).max(previous)
            };
            self.points[i].1 = ratio;
            previous = ratio;
        }
        self.points = convex(&self.points);
    }
}

impl CostCurve {
    /// How many nodes of each draft to verify in one step, so that useful rows per unit
    /// of cost are most. `values[i]` are draft `i`'s nodes in the order they may be
    /// taken (each prefix a subtree), as expected accepted tokens. `fixed_rows` run
    /// whatever is drafted: prefill chunks and each decoding sequence's pending token.
    ///
    /// Every fixed row counts as one useful row: a prefill row is work the server must
    /// do as surely as a decoded token. Counting only decoded tokens made a step full of
    /// prefill look like a poor step that drafts could only improve, and a busy server
    /// drafted more than it could afford. With nothing worth its cost, every cut is 0:
    /// plain decoding. For one sequence alone the measure is (1 + expected) / (t(1 + k)
    /// / t(1)).
    pub fn best_cut(&self, fixed_rows: usize, values: &[Vec<f64>]) -> Vec<usize> {
        let mut taken = vec![0usize; values.len()];
        let mut useful = fixed_rows as f64;
        let mut rows = fixed_rows;
        let mut best = (useful / self.cost(rows), taken.clone());
        loop {
            // The most likely next node across all drafts; ties to the first draft.
            let next = (0..values.len())
                .filter(|&i| taken[i] < values[i].len())
                .map(|i| (values[i][taken[i]], i))
                .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
            let Some((value, i)) = next else { break };
            taken[i] += 1;
            useful += value;
            rows += 1;
            let gain = useful / self.cost(rows);
            if gain > best.0 {
                best = (gain, taken.clone());
            }
        }
        best.1
    }
}

/// Why a cost curve could not be read from a file (`--cost-curve`).
#[derive(Debug, thiserror::Error)]
pub enum CostCurveError {
    /// No line of the file is a JSON object with a curve.
    #[error(
        "no line of the file is a JSON object with a cost curve (\"curve\" or \"points\", or \"cost_curve\": {{\"points\": ...}}, each [[K, t(K)/t(1)], ...]) as examples/shape_cost and e2e-bench --json write them"
    )]
    NoCurve,
    /// The curve's points are not a curve.
    #[error(
        "the cost curve's points {0}: give [[1, 1.0], [K, ratio], ...] with K rising from 1 and finite ratios above 0"
    )]
    BadPoints(String),
}

impl CostCurve {
    /// Check that `points` can be a curve: they start at K = 1, rise in K, and every
    /// ratio is finite and above 0. Returns the ratio at K = 1.
    pub fn check_points(points: &[(usize, f64)]) -> Result<f64, CostCurveError> {
        let Some(&(1, base)) = points.first() else {
            return Err(CostCurveError::BadPoints("do not start at K = 1".into()));
        };
        if !points.windows(2).all(|w| w[0].0 < w[1].0) {
            return Err(CostCurveError::BadPoints("do not rise in K".into()));
        }
        if !points.iter().all(|p| p.1.is_finite() && p.1 > 0.0) {
            return Err(CostCurveError::BadPoints(
                "have a ratio that is not finite and above 0".into(),
            ));
        }
        Ok(base)
    }

    /// The curve in a file of JSON lines, as `examples/shape_cost` (`"curve"`) and
    /// `e2e-bench --json` (`"cost_curve": {"points": ...}`) print them: the last line
    /// that holds one (shape_cost prints one per context, the longest last). Ratios are
    /// taken relative to K = 1. The curve is fixed: steps do not correct it.
    pub fn from_json_lines(text: &str) -> Result<Self, CostCurveError> {
        let points = text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|v| {
                let points = v
                    .get("curve")
                    .or_else(|| v.get("points"))
                    .or_else(|| v.get("cost_curve")?.get("points"))?;
                Some(serde_json::from_value::<Vec<(usize, f64)>>(points.clone()))
            })
            .next_back()
            .ok_or(CostCurveError::NoCurve)?
            .map_err(|e| {
                CostCurveError::BadPoints(format!("are not pairs of a count and a ratio ({e})"))
            })?;
        let base = Self::check_points(&points)?;
        let mut relative: Vec<(usize, f64)> = points.iter().map(|&(k, r)| (k, r / base)).collect();
        if relative.len() == 1 {
            relative.push((64, 1.0));
        }
        Ok(Self::new(relative, 0.0))
    }
}

/// The curve made convex from K = 2 on: past the second row, the cost of one more row
/// never falls as rows grow. That holds on every device we run on (a CPU pays about the
/// same per row, a GPU nothing up to its width and then per row), so where timings say
/// otherwise it is noise. Noise of that kind is costly: a dip makes one stretch of rows
/// look almost free, and a busy server then verifies drafts it cannot afford. The first
/// segment, one row to two, is left as measured: there a single-row product (a
/// matrix-vector kernel) gives way to a matrix-matrix one, and the step is real (f32 on
/// this CPU: two rows cost 1.6–2.2 times one, four rows little more than two). Pooling
/// that step into the rest spread it over every row and made small drafts look cheap:
/// chat drafts of two to five rows were verified at twice the cost the curve said.
/// The per-row costs after the first segment are replaced by their weighted
/// least-squares non-decreasing fit (pool adjacent violators), which keeps the cost at
/// K = 2 and at the last point.
fn convex(points: &[(usize, f64)]) -> Vec<(usize, f64)> {
    if points.len() <= 2 {
        return points.to_vec();
    }
    let mut out = points[..1].to_vec();
    out.extend(convex_slopes(&points[1..]));
    out
}

/// `points` with their per-row slopes made non-decreasing, first and last cost kept.
fn convex_slopes(points: &[(usize, f64)]) -> Vec<(usize, f64)> {
    // Blocks of pooled segments: (rows spanned, mean cost per row).
    let mut blocks: Vec<(f64, f64)> = Vec::with_capacity(points.len());
    let mut sizes: Vec<usize> = Vec::with_capacity(points.len());
    for w in points.windows(2) {
        let width = w[1].0.saturating_sub(w[0].0).max(1) as f64;
        blocks.push((width, (w[1].1 - w[0].1) / width));
        sizes.push(1);
        while blocks.len() > 1 && blocks[blocks.len() - 2].1 > blocks[blocks.len() - 1].1 {
            let (w1, s1) = blocks.pop().expect("two blocks");
            let n1 = sizes.pop().expect("two blocks");
            let (w0, s0) = blocks.last_mut().expect("two blocks");
            *s0 = (*s0 * *w0 + s1 * w1) / (*w0 + w1);
            *w0 += w1;
            *sizes.last_mut().expect("two blocks") += n1;
        }
    }
    let mut out = Vec::with_capacity(points.len());
    let Some(&first) = points.first() else {
        return out;
    };
    out.push(first);
    let mut at = 1;
    for ((_, slope), n) in blocks.iter().zip(&sizes) {
        for _ in 0..*n {
            let (k0, c0) = out[at - 1];
            let k1 = points[at].0;
            out.push((k1, c0 + slope * k1.saturating_sub(k0).max(1) as f64));
            at += 1;
        }
    }
    out
}

/// Piecewise-linear interpolation of `(K, value)` points, extrapolated from the last two.
fn interpolate(points: &[(usize, f64)], k: usize) -> f64 {
    if k <= points[0].0 || points.len() == 1 {
        return points[0].1;
    }
    for w in points.windows(2) {
        let ((k0, c0), (k1, c1)) = (w[0], w[1]);
        if k <= k1 {
            return c0 + (c1 - c0) * (k - k0) as f64 / (k1 - k0) as f64;
        }
    }
    let n = points.len();
    let ((k0, c0), (k1, c1)) = (points[n - 2], points[n - 1]);
    c1 + (c1 - c0) / (k1 - k0) as f64 * (k - k1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> CostCurve {
        CostCurve::new(vec![(1, 1.0), (4, 2.0), (16, 6.0), (64, 30.0)], 10.0)
    }

    #[test]
    fn a_curve_file_gives_its_last_curve_relative_to_one_row() {
        let text = concat!(
            "plain 100 tok/s, not JSON\n",
            r#"{"shape":"x","context":64,"curve":[[1,1.0],[2,1.1]]}"#,
            "\n",
            r#"{"shape":"x","context":1024,"curve":[[1,2.0],[8,2.2],[32,3.0]]}"#,
            "\n",
        );
        let c = CostCurve::from_json_lines(text).unwrap();
        assert_eq!(c.points, vec![(1, 1.0), (8, 1.1), (32, 1.5)]);
        assert_eq!(c.t1_ms, 0.0, "fixed: steps do not correct it");
        let report = r#"{"generations":2,"cost_curve":{"points":[[1,1.0],[16,1.25]],"t1_ms":0.9}}"#;
        assert_eq!(
            CostCurve::from_json_lines(report).unwrap().points,
            vec![(1, 1.0), (16, 1.25)]
        );
        for (bad, says) in [
            ("{}", "no line"),
            (r#"{"curve":[[2,1.0],[4,2.0]]}"#, "K = 1"),
            (r#"{"curve":[[1,1.0],[4,2.0],[3,2.5]]}"#, "rise"),
            (r#"{"curve":[[1,1.0],[4,-2.0]]}"#, "above 0"),
            (r#"{"curve":"fast"}"#, "pairs"),
        ] {
            let e = CostCurve::from_json_lines(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn interpolates_and_extrapolates() {
        let c = CostCurve::new(vec![(1, 1.0), (2, 1.5), (4, 3.0)], 1.0);
        assert_eq!(c.cost(1), 1.0);
        assert_eq!(c.cost(3), 2.25);
        assert_eq!(c.cost(6), 4.5);
    }

    #[test]
    fn a_uniformly_slower_machine_keeps_the_ratios() {
        let mut c = measured();
        for _ in 0..200 {
            for (k, ratio) in [(1, 1.0), (4, 2.0), (16, 6.0), (64, 30.0)] {
                c.observe(k, 3.0 * 10.0 * ratio / 1e3);
            }
        }
        for (k, want) in [(1, 1.0), (4, 2.0), (16, 6.0), (64, 30.0)] {
            assert!(
                (c.cost(k) - want).abs() < 1e-6,
                "K={k}: {} vs {want}",
                c.cost(k)
            );
        }
        assert!((c.corrections[2].0 - 3.0).abs() < 1e-6);
    }

    #[test]
    fn batched_rows_that_cost_more_than_measured_raise_the_curve_where_they_run() {
        let mut c = measured();
        // Steps of 16 rows take twice what the probe said; steps of 1 and 4 rows as said.
        for _ in 0..200 {
            c.observe(1, 10.0e-3);
            c.observe(4, 20.0e-3);
            c.observe(16, 2.0 * 60.0e-3);
        }
        assert!((c.cost(16) - 12.0).abs() < 1e-6, "{}", c.cost(16));
        assert!((c.cost(4) - 2.0).abs() < 1e-6);
        // 64 was never observed: it borrows the correction of its observed neighbour.
        assert!((c.cost(64) - 60.0).abs() < 1e-6, "{}", c.cost(64));
    }

    #[test]
    fn ratios_never_fall_with_k_and_hiccups_are_clamped() {
        let mut c = measured();
        for _ in 0..50 {
            c.observe(16, 6.0 * 10.0 / 1e3);
        }
        c.observe(16, 1000.0);
        assert!(c.corrections[2].0 <= 1.0 + RATE * (CLAMP.1 - 1.0) + 1e-9);
        for _ in 0..200 {
            c.observe(4, 8.0 * 10.0 / 1e3); // 4 rows now cost more than measured 16
        }
        for w in c.points.windows(2) {
            assert!(w[1].1 >= w[0].1, "{:?}", c.points);
        }
    }

    #[test]
    fn a_dip_in_the_timings_is_smoothed_and_the_ends_are_kept() {
        // As measured on this CPU under load: 12 → 16 rows looked almost free.
        let raw = vec![
            (1, 1.0),
            (2, 1.6),
            (8, 4.62),
            (12, 9.29),
            (16, 10.22),
            (24, 16.09),
        ];
        let c = CostCurve::new(raw.clone(), 10.0);
        let slopes: Vec<f64> = c
            .points
            .windows(2)
            .map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0) as f64)
            .collect();
        assert!(
            slopes[1..].windows(2).all(|s| s[1] >= s[0] - 1e-12),
            "{slopes:?}"
        );
        assert_eq!(c.points[..2], raw[..2]);
        assert!((c.cost(24) - 16.09).abs() < 1e-9);
        // 8 → 16 is pooled: 5.60 over 8 rows, 0.70 per row, not 0.23 from 12 to 16.
        assert!(
            (c.cost(16) - c.cost(12) - 4.0 * 0.7).abs() < 1e-9,
            "{:?}",
            c.points
        );
        // A curve that is already convex is left as it is.
        let convex_curve = vec![(1, 1.0), (4, 2.0), (16, 6.0), (64, 30.0)];
        assert_eq!(
            CostCurve::new(convex_curve.clone(), 1.0).points,
            convex_curve
        );
    }

    #[test]
    fn the_step_from_one_row_to_two_is_kept() {
        // f32 on this CPU: a matrix-vector product for one row, matrix-matrix beyond.
        let raw = vec![(1, 1.0), (2, 1.8), (4, 2.0), (8, 2.4), (16, 3.2), (32, 5.6)];
        let c = CostCurve::new(raw.clone(), 10.0);
        assert_eq!(c.points, raw);
        // A one-token draft at 0.5 does not pay for the step: (1 + 0.5) / 1.8 < 1.
        assert_eq!(c.best_cut(1, &[vec![0.5]]), vec![0]);
        // Three sure tokens do: 4 / 2.0.
        assert_eq!(c.best_cut(1, &[vec![1.0, 1.0, 1.0]]), vec![3]);
    }

    #[test]
    fn drafts_pay_alone_but_not_beside_a_prefill_chunk() {
        // A CPU: each row costs 0.6 of a single-token step more.
        let c = CostCurve::linear(0.6);
        let draft = vec![vec![0.9, 0.2]];
        // Alone: (1 + 0.9) / 1.6 beats 1 / 1; the second node does not pay.
        assert_eq!(c.best_cut(1, &draft), vec![1]);
        // Beside 63 prefill rows the step is already 64 useful rows for t(64); a row
        // at 0.9 lowers useful rows per cost.
        assert_eq!(c.best_cut(64, &draft), vec![0]);
        // Free verification takes everything; nothing drafted takes nothing.
        assert_eq!(
            CostCurve::flat().best_cut(4, &[vec![0.5], vec![0.3, 0.1]]),
            vec![1, 2]
        );
        assert_eq!(c.best_cut(3, &[vec![], vec![]]), vec![0, 0]);
    }

    #[test]
    fn given_curves_and_out_of_range_steps_teach_nothing() {
        let mut flat = CostCurve::flat();
        flat.observe(8, 1.0);
        assert_eq!(flat.cost(8), 1.0);
        let mut c = measured();
        c.observe(65, 1.0);
        c.observe(0, 1.0);
        c.observe(8, f64::NAN);
        assert_eq!(c.observed_steps, 0);
        assert_eq!(c.cost(16), 6.0);
    }
}
