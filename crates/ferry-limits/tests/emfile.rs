//! Accepting while the process is out of descriptors backs off instead of spinning. Its own
//! test binary: it lowers this process's RLIMIT_NOFILE.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ferry_limits::{Acceptor, fdlimit};

/// The number the next descriptor would get (the lowest free one): a soft limit equal to it
/// leaves no descriptor to open.
fn lowest_free_fd() -> u64 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open("/dev/null").unwrap();
    u64::try_from(f.as_raw_fd()).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn accept_out_of_descriptors_backs_off() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Pending connections wait in the listen queue.
    let clients: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let before = fdlimit::current();
    // No descriptor left for accept(2).
    fdlimit::raise_nofile(Some(lowest_free_fd())).unwrap();
    let mut acceptor = Acceptor::new("test");
    let r = tokio::time::timeout(Duration::from_secs(2), acceptor.accept(&listener)).await;
    let failures = acceptor.failures();
    fdlimit::raise_nofile(Some(before.soft)).unwrap();
    assert!(r.is_err(), "accepted with no descriptor left");
    // 5 ms doubling: about 9 attempts in 2 s; a spinning loop makes millions.
    assert!(
        (2..=20).contains(&failures),
        "{failures} failed accepts in 2 s"
    );
    assert!(acceptor.backoff() >= Some(Duration::from_millis(160)));
    // With descriptors back, the pending connection is accepted and the backoff resets.
    let (_s, _) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(&listener))
        .await
        .unwrap();
    assert_eq!(acceptor.backoff(), None);
    drop(clients);
}
