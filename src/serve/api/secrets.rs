//! What the gates in front of the admin API and the OpenAI routes share: comparing a
//! secret in constant time, reading a bearer token, and a cap on wrong guesses per source.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderMap, StatusCode, header};

use super::ApiError;

/// The token of an `Authorization: Bearer <token>` header, if the request has one.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Whether `given` equals `secret`, in a time that depends on their lengths only, not on
/// where they first differ (which would let a client find the token byte by byte).
pub(super) fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != secret.len());
    for (i, &s) in secret.iter().enumerate() {
        diff |= s ^ given.get(i).copied().unwrap_or(!s);
    }
    std::hint::black_box(diff) == 0
}

/// A cap on wrong secrets (admin tokens, API keys) per source: past
/// [`GuessGuard::FAILURES_PER_SECOND`] in one second, a source's requests that need the
/// secret are refused (429) for the rest of it, so
/// guessing runs at that rate rather than as fast as a connection carries requests,
/// and a guesser elsewhere does not lock the operator out. A source is an IPv4 address
/// or an IPv6 /64 (one host's share); past [`GuessGuard::SOURCES`] sources guessing at
/// once, the rest share one window.
#[derive(Default)]
pub struct GuessGuard {
    /// Each source's current one-second window and the failures in it.
    windows: std::sync::Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl GuessGuard {
    /// Wrong tokens allowed per second and source.
    pub const FAILURES_PER_SECOND: u32 = 20;
    /// Sources tracked at once.
    pub const SOURCES: usize = 4096;
    /// The shared window of sources past [`GuessGuard::SOURCES`] and of requests whose
    /// address is unknown.
    const SHARED: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

    /// Where `request` comes from, as the guard counts it.
    pub(super) fn source_of_request(request: &Request) -> IpAddr {
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>();
        Self::source_of(peer.map(|ConnectInfo(peer)| peer.ip()))
    }

    /// The source a peer's address counts as.
    fn source_of(peer: Option<IpAddr>) -> IpAddr {
        match peer.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V6(v6)) => {
                let host = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(host))
            }
            Some(v4) => v4,
            None => Self::SHARED,
        }
    }

    /// The window `source` counts in: its own, or the shared one when [`Self::SOURCES`]
    /// others are tracked.
    fn window_of(windows: &HashMap<IpAddr, (Instant, u32)>, source: IpAddr) -> IpAddr {
        if windows.len() >= Self::SOURCES && !windows.contains_key(&source) {
            Self::SHARED
        } else {
            source
        }
    }

    /// The failures counted against `source` in the current second.
    fn failures(&self, source: IpAddr) -> u32 {
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        match windows.get(&Self::window_of(&windows, source)) {
            Some((start, n)) if start.elapsed() < Duration::from_secs(1) => *n,
            _ => 0,
        }
    }

    /// None while `source` may try a secret; else the 429 that refuses it (`what`: the
    /// secret, as the message names it).
    pub(super) fn refusal(&self, source: IpAddr, what: &str) -> Option<ApiError> {
        if self.may_try(source) {
            return None;
        }
        let mut refusal = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "more than {} wrong {what}s in the last second from {source}: its requests are refused until it has passed",
                Self::FAILURES_PER_SECOND
            ),
        );
        refusal.retry_after_s = Some(1);
        Some(refusal)
    }

    fn may_try(&self, source: IpAddr) -> bool {
        self.failures(source) < Self::FAILURES_PER_SECOND
    }

    /// Count a wrong secret from `source`.
    pub(super) fn failed(&self, source: IpAddr) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let expired = |start: &Instant| start.elapsed() >= Duration::from_secs(1);
        if Self::window_of(&windows, source) == Self::SHARED {
            windows.retain(|_, (start, _)| !expired(start));
        }
        let key = Self::window_of(&windows, source);
        let window = windows.entry(key).or_insert((Instant::now(), 0));
        if expired(&window.0) {
            *window = (Instant::now(), 0);
        }
        window.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(GuessGuard::source_of(Some(v4)), v4);
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(GuessGuard::source_of(Some(mapped)), v4);
        let (a, b): (IpAddr, IpAddr) = (
            "2001:db8:1:2::1".parse().unwrap(),
            "2001:db8:1:2:ffff::9".parse().unwrap(),
        );
        assert_eq!(
            GuessGuard::source_of(Some(a)),
            GuessGuard::source_of(Some(b))
        );
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_ne!(
            GuessGuard::source_of(Some(a)),
            GuessGuard::source_of(Some(other))
        );
        assert_eq!(GuessGuard::source_of(None), GuessGuard::SHARED);
    }

    #[test]
    fn one_source_guessing_does_not_lock_out_another() {
        let guard = GuessGuard::default();
        let (guesser, operator): (IpAddr, IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for _ in 0..GuessGuard::FAILURES_PER_SECOND {
            assert!(guard.may_try(guesser));
            guard.failed(guesser);
        }
        assert!(!guard.may_try(guesser));
        assert!(guard.may_try(operator));
    }

    #[test]
    fn sources_past_the_cap_share_one_window() {
        let guard = GuessGuard::default();
        for i in 0..GuessGuard::SOURCES as u32 {
            guard.failed(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        }
        let late: IpAddr = "192.0.2.9".parse().unwrap();
        for _ in 0..GuessGuard::FAILURES_PER_SECOND {
            guard.failed(late);
        }
        assert_eq!(guard.windows.lock().unwrap().len(), GuessGuard::SOURCES + 1);
        assert!(
            !guard.may_try(late),
            "the late source's failures filled the shared window"
        );
        assert!(!guard.may_try("192.0.2.10".parse().unwrap()));
        assert!(guard.may_try(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000))));
    }
}
