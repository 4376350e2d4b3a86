//! Watches that sync with one streaming list (`sendInitialEvents=true`, upstream's WatchList:
//! the initial objects as watch events, then a bookmark marking their end) instead of pages of
//! 500, and fall back to paged lists when the server refuses that (400/422: servers without
//! the feature reject `sendInitialEvents` or `resourceVersionMatch` on a watch). Every Ferry
//! component that keeps a cache of a kind (controllers, DNS) watches through [`stream`].

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// The watch events of `api` with `config`: streaming list first, paged lists if the server
/// refuses it (decided once, on the first answer). `kind` names the watch in the log line.
pub fn stream<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: impl Into<String>,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let streaming = watcher::watcher(api.clone(), config.clone().streaming_lists()).boxed();
    with_fallback(streaming, kind.into(), move || {
        watcher::watcher(api, config).boxed()
    })
}

/// The pure part of [`stream`]: items of `first` until its first answer; a refusal (see
/// [`refuses_streaming`]) switches to `fallback()` for good, anything else keeps `first`.
fn with_fallback<K, S, F>(
    first: S,
    kind: String,
    fallback: F,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Send + 'static,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    F: FnOnce() -> BoxStream<'static, watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    futures::stream::unfold(
        (first.boxed(), Some(fallback), kind),
        |(mut stream, mut fallback, kind)| async move {
            loop {
                let item = stream.next().await?;
                if fallback.is_some() {
                    match &item {
                        Err(e) if refuses_streaming(e) => {
                            tracing::info!(
                                kind = %kind,
                                "the API server refuses streaming lists, using paged lists: {e}"
                            );
                            if let Some(f) = fallback.take() {
                                stream = f();
                            }
                            continue;
                        }
                        // The server accepted the streaming watch.
                        Ok(_) => fallback = None,
                        Err(_) => {}
                    }
                }
                return Some((item, (stream, fallback, kind)));
            }
        },
    )
    .boxed()
}

/// Whether a watch error says the server does not serve streaming lists.
pub fn refuses_streaming(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return false,
    };
    matches!(code, 400 | 422)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> Box<kube::core::Status> {
        Box::new(kube::core::Status::failure("refused", "Invalid").with_code(code))
    }

    #[test]
    fn only_a_refused_watch_request_falls_back_to_paged_lists() {
        for (code, refused) in [
            (400, true),
            (422, true),
            (403, false),
            (500, false),
            (410, false),
        ] {
            let start = watcher::Error::WatchStartFailed(kube::Error::Api(status(code)));
            assert_eq!(refuses_streaming(&start), refused, "start {code}");
            let event = watcher::Error::WatchError(status(code));
            assert_eq!(refuses_streaming(&event), refused, "event {code}");
        }
        assert!(!refuses_streaming(&watcher::Error::NoResourceVersion));
        assert!(!refuses_streaming(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(422))
        )));
    }

    type Item = watcher::Result<watcher::Event<u32>>;

    fn collect(first: Vec<Item>, fallback: Vec<Item>) -> Vec<String> {
        let s = with_fallback(futures::stream::iter(first), "T".into(), move || {
            futures::stream::iter(fallback).boxed()
        });
        futures::executor::block_on(s.collect::<Vec<_>>())
            .into_iter()
            .map(|i| match i {
                Ok(watcher::Event::Apply(n)) => format!("apply {n}"),
                Ok(_) => "other".to_string(),
                Err(e) => format!("err {}", refuses_streaming(&e)),
            })
            .collect()
    }

    #[test]
    fn a_refusal_switches_to_paged_lists_and_later_errors_do_not() {
        let refused = || {
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(status(
                422,
            ))))
        };
        // Refused at once: the fallback's items only.
        assert_eq!(
            collect(
                vec![refused(), Ok(watcher::Event::Apply(9))],
                vec![Ok(watcher::Event::Apply(1))]
            ),
            ["apply 1"]
        );
        // Accepted: a later 422 is passed on (the watcher backs off), no switch.
        assert_eq!(
            collect(
                vec![Ok(watcher::Event::Apply(1)), refused()],
                vec![Ok(watcher::Event::Apply(7))]
            ),
            ["apply 1", "err true"]
        );
        // Another error first (e.g. 500) is passed on and the decision waits.
        let e500 = Err(watcher::Error::WatchStartFailed(kube::Error::Api(status(
            500,
        ))));
        assert_eq!(
            collect(vec![e500, refused()], vec![Ok(watcher::Event::Apply(3))]),
            ["err false", "apply 3"]
        );
    }
}
