//! The watch task: one etcd watch stream per store watch, reopened on another endpoint from the
//! revision after the last delivered event when the stream breaks.

use super::*;

/// Why one watch stream ended.
pub(super) enum WatchEnd {
    /// The consumer dropped the stream.
    ConsumerGone,
    /// Report this error and stop.
    Fatal(StoreError),
    /// The endpoint failed; resume elsewhere.
    Broken(String),
}

pub(super) struct WatchTask {
    pub(super) client: Arc<Client>,
    pub(super) keys: KeyMap,
    pub(super) prefix: String,
    pub(super) resume_for: Duration,
}

pub(super) type Outbound = mpsc::Sender<pb::WatchRequest>;
pub(super) type Inbound = tonic::Streaming<pb::WatchResponse>;
/// An open etcd watch: the endpoint index, the request side (kept open), the responses.
pub(super) type Opened = (usize, Outbound, Inbound);

impl WatchTask {
    /// Opens an etcd watch for events after `after` and waits for its `created` answer.
    pub(super) async fn open(&self, after: Revision) -> std::result::Result<Opened, WatchEnd> {
        let (i, channel) = self.client.pick();
        match tokio::time::timeout(self.client.timeout, self.open_on(channel, after)).await {
            Ok(Ok((out, inbound))) => Ok((i, out, inbound)),
            Ok(Err(WatchEnd::Broken(why))) => {
                self.client.failed(i, &why);
                Err(WatchEnd::Broken(why))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                let why = "etcd: watch not created in time".to_string();
                self.client.failed(i, &why);
                Err(WatchEnd::Broken(why))
            }
        }
    }

    pub(super) async fn open_on(
        &self,
        channel: Channel,
        after: Revision,
    ) -> std::result::Result<(Outbound, Inbound), WatchEnd> {
        let key = self.keys.to_etcd(&self.prefix);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    range_end: prefix_end(&key),
                    key,
                    start_revision: after + 1,
                    progress_notify: false,
                    prev_kv: true,
                },
            )),
        };
        let (out_tx, out_rx) = mpsc::channel(4);
        out_tx
            .send(create)
            .await
            .map_err(|_| WatchEnd::Broken("watch request channel closed".into()))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| WatchEnd::Broken(format!("etcd: connecting: {e}{}", source_chain(&e))))?;
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(out_rx));
        // Have the member cancel the watch when it loses its leader (etcd's WithRequireLeader),
        // so that a partitioned member does not silently stall the watch.
        request.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let codec = tonic_prost::ProstCodec::<pb::WatchRequest, pb::WatchResponse>::default();
        let mut inbound = grpc
            .streaming(request, PathAndQuery::from_static(WATCH), codec)
            .await
            .map_err(|s| match classify(&s) {
                Failure::Final(e) => WatchEnd::Fatal(e),
                Failure::Endpoint(w) | Failure::NotSent(w) => WatchEnd::Broken(w),
            })?
            .into_inner();
        loop {
            let msg = inbound
                .message()
                .await
                .map_err(|s| WatchEnd::Broken(format!("etcd watch: {}", s.message())))?;
            let Some(msg) = msg else {
                return Err(WatchEnd::Broken("etcd watch stream ended".into()));
            };
            if msg.canceled {
                return Err(cancel_reason(&msg, after));
            }
            if msg.created {
                return Ok((out_tx, inbound));
            }
        }
    }

    pub(super) async fn run(
        self,
        mut after: Revision,
        mut stream: Option<Opened>,
        tx: mpsc::Sender<Result<Event>>,
    ) {
        let mut broken_since: Option<Instant> = None;
        let mut backoff = Duration::from_millis(50);
        loop {
            let (endpoint, out, inbound) = match stream.take() {
                Some(s) => s,
                None => {
                    let since = *broken_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > self.resume_for {
                        let _ = tx
                            .send(Err(StoreError::Unavailable(
                                "etcd watch could not be resumed".into(),
                            )))
                            .await;
                        return;
                    }
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    match self.open(after).await {
                        Ok(s) => s,
                        Err(WatchEnd::Fatal(e)) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                        Err(WatchEnd::ConsumerGone) => return,
                        Err(WatchEnd::Broken(why)) => {
                            tracing::debug!("etcd watch resume failed: {why}");
                            continue;
                        }
                    }
                }
            };
            match self.pump(&mut after, inbound, &tx, &mut broken_since).await {
                WatchEnd::ConsumerGone => return,
                WatchEnd::Fatal(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                WatchEnd::Broken(why) => {
                    tracing::warn!(after, "etcd watch broke ({why}); resuming");
                    backoff = Duration::from_millis(50);
                    self.client.failed(endpoint, &why);
                }
            }
            drop(out);
        }
    }

    /// Passes events on until the stream ends. `after` follows the last delivered revision.
    pub(super) async fn pump(
        &self,
        after: &mut Revision,
        mut inbound: Inbound,
        tx: &mpsc::Sender<Result<Event>>,
        broken_since: &mut Option<Instant>,
    ) -> WatchEnd {
        loop {
            let msg = tokio::select! {
                _ = tx.closed() => return WatchEnd::ConsumerGone,
                m = inbound.message() => m,
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) => return WatchEnd::Broken("etcd watch stream ended".into()),
                Err(s) => return WatchEnd::Broken(format!("etcd watch: {}", s.message())),
            };
            *broken_since = None;
            if msg.canceled {
                return cancel_reason(&msg, *after);
            }
            for ev in msg.events {
                let Some(event) = convert_event(&self.keys, ev) else {
                    continue;
                };
                let rev = event.revision();
                if rev <= *after {
                    continue;
                }
                if !event.key().starts_with(self.prefix.as_str()) {
                    *after = rev;
                    continue;
                }
                if tx.send(Ok(event)).await.is_err() {
                    return WatchEnd::ConsumerGone;
                }
                *after = rev;
            }
        }
    }
}

pub(super) fn cancel_reason(msg: &pb::WatchResponse, after: Revision) -> WatchEnd {
    if msg.compact_revision > 0 {
        WatchEnd::Fatal(StoreError::Compacted {
            requested: after,
            compacted: msg.compact_revision,
        })
    } else {
        WatchEnd::Broken(format!("etcd cancelled the watch: {}", msg.cancel_reason))
    }
}

/// An etcd watch event as a store event (`None` for keys outside the prefix).
pub(super) fn convert_event(keys: &KeyMap, ev: pb::Event) -> Option<Event> {
    let to_kv = |kv: pb::KeyValue| -> Option<KeyValue> {
        Some(KeyValue {
            key: keys.from_etcd(&kv.key)?,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        })
    };
    let kv = ev.kv?;
    if ev.r#type == pb::EVENT_DELETE {
        let revision = kv.mod_revision;
        let prev = match ev.prev_kv.and_then(to_kv) {
            Some(p) => p,
            // The previous value is gone (compacted): keep the key, without a value.
            None => KeyValue {
                key: keys.from_etcd(&kv.key)?,
                value: Bytes::new(),
                create_revision: 0,
                mod_revision: 0,
            },
        };
        Some(Event::Delete { prev, revision })
    } else {
        let created = kv.version == 1;
        let prev = if created {
            None
        } else {
            ev.prev_kv.and_then(to_kv)
        };
        Some(Event::Put {
            kv: to_kv(kv)?,
            prev,
        })
    }
}
