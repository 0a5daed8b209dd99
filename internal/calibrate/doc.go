// Package calibrate learns, from outcomes, how far an engine's latency
// departs from what the built-in engine model predicts, and says how well it
// predicts.
//
// A Model predicts a latency y in seconds (one Model for time to first
// token, another for the time between tokens) on backend b from a feature
// vector x whose entry 0 is the constant 1 and entry 1, by convention, the
// built-in engine model's own prediction (the prior):
//
//	ŷ_b(x) = max(θ_b·x, floor),  θ_b = argmin_θ Σ_k λ^(t−k) (y_k − θ·x_k)²/y_k²  +  κ_b (θ − θ_fleet)ᵀ P (θ − θ_fleet)
//
// where θ_fleet is the same fit over every backend's observations, shrunk
// toward the prior θ₀ = (0, 1, 0, …) with weight κ_fleet instead. The 80 % interval is ŷ·[e^q₁₀, e^q₉₀], the
// quantiles of the recent log(y/ŷ) on b pooled with the fleet's worth κ_b
// observations.
//
// Defaults (Config): a memory of 100 observations (λ = 0.99), κ_fleet = 2
// and κ_b = 20 observations, a floor of 1 ms, the 10th and 90th
// percentiles.
//
// Why this form:
//   - Linear in features the caller chooses, so the router can add a
//     feature (GPU utilisation, running × uncached tokens for batch
//     slowdown) without touching the learner, and the hot path is a dot
//     product.
//   - Weighted by 1/y², the fit minimises relative error: TTFTs span 10 ms
//     to 10 s and an absolute fit would serve only the long prompts. The
//     weight is the observed latency's, not a prediction's: engines'
//     latencies are often bimodal (milliseconds when a batch slot is free,
//     seconds when the request waits for one), and weighed by a prediction
//     of milliseconds one request that waited seconds would make every
//     prediction seconds, while a feature that explains the wait (the
//     router's slot-wait estimate) would be learned only slowly. The price
//     is a fit a few per cent below the mean under noise, the median-like
//     predictor that the median absolute percentage error rewards.
//   - Exponential forgetting (λ = 1 − 1/Memory, Memory = 100 observations
//     by default) re-fits a changed engine (a restart with other flags, a
//     slower GPU) within 300 requests: after 300 the old engine's share of
//     the fit is e⁻³ ≈ 5 %. With a memory of 150 the error of an engine
//     whose speed halved was back under 15 % only after 301 to 315
//     requests in 3 of 12 seeded runs (TestAdapts' engine); 100 brought it
//     back within 188 to 218 and cost nothing measurable in steady state.
//   - The penalties are not forgotten (only the data is), so a feature
//     that stops varying cannot wind the fit up, the classic failure of
//     recursive least squares with forgetting. P = (G + 0.1·diag G)/n is
//     the mean over the fleet's traffic of x xᵀ/y², so the first part of
//     the penalty counts in observations how far θ predicts from its
//     reference on that traffic, whatever the features' units, and a fit
//     with n observations lands n/(n + κ) of the way from the reference to
//     its own least squares; the diagonal part pins the coefficients of
//     features that move together. κ_fleet = 2 (the prior is a guess; data
//     overrides it in tens of requests); κ_b = 20 (a backend with 5
//     observations predicts mostly like the fleet), fading as 20 × Memory/n
//     once the backend has seen n > Memory observations, down to 2: a
//     backend that has differed from the fleet for hundreds of requests
//     differs, and a constant pull would bias it for good. With d ≤ 8
//     features the normal equations are solved afresh (Cholesky, a few
//     hundred flops) on every observation, which recursive least squares
//     would only approximate.
//   - Intervals come from the residuals of predictions made before each
//     observation, so they include the fit's own error, and from a decayed
//     histogram (bins of 0.025 in log ratio, ±2.5) rather than a normal
//     model: engine latencies have heavy, skewed tails.
//
// Accuracy keeps score of any predictor (count, median absolute percentage
// error after a warm-up, interval coverage, a histogram of observed over
// predicted) and exports it to Prometheus. CacheSignal notices when the
// prompt tokens the router predicts cached on a backend are not the ones
// its engine reports cached, so that affinity that buys nothing stops being
// paid for.
package calibrate
