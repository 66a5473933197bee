//! Whether a connection's peer is taking bytes: what the application wrote, less
//! what the kernel still holds unacknowledged (`SIOCOUTQ`, Linux), over time.

use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// How long a connection's send queue has held bytes the peer did not acknowledge.
pub struct SendProgress {
    #[cfg(target_os = "linux")]
    fd: std::os::fd::RawFd,
    acked: u64,
    since: Instant,
}

impl SendProgress {
    /// For `tcp`; valid while the stream lives (its owner asks).
    pub fn new(tcp: &TcpStream) -> Self {
        #[cfg(not(target_os = "linux"))]
        let _ = tcp;
        SendProgress {
            #[cfg(target_os = "linux")]
            fd: std::os::fd::AsRawFd::as_raw_fd(tcp),
            acked: 0,
            since: Instant::now(),
        }
    }

    /// Bytes in the kernel's send queue not yet acknowledged by the peer.
    #[cfg(target_os = "linux")]
    fn queued(&self) -> Option<u64> {
        let mut n: libc::c_int = 0;
        // SAFETY: `fd` is the open socket of the stream this belongs to; TIOCOUTQ
        // (SIOCOUTQ) writes one int.
        let r = unsafe { libc::ioctl(self.fd, libc::TIOCOUTQ, &mut n) };
        (r == 0 && n >= 0).then_some(n as u64)
    }

    #[cfg(not(target_os = "linux"))]
    fn queued(&self) -> Option<u64> {
        None
    }

    /// Given the bytes written so far, how long bytes have waited with the peer
    /// acknowledging none of them (zero while the queue is empty or draining;
    /// always zero where the queue cannot be read).
    pub fn stalled_for(&mut self, written: u64) -> Duration {
        let now = Instant::now();
        match self.queued() {
            Some(q) if q > 0 => {
                let acked = written.saturating_sub(q);
                if acked != self.acked {
                    self.acked = acked;
                    self.since = now;
                }
            }
            _ => {
                self.acked = written;
                self.since = now;
            }
        }
        now - self.since
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A peer that never reads: the queue fills and the stall clock runs; once
    /// it reads, the clock starts over.
    #[tokio::test]
    async fn a_peer_that_stops_reading_stalls() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = l.accept().await.unwrap();
        let mut p = SendProgress::new(&server);
        assert_eq!(p.stalled_for(0), Duration::ZERO);
        let chunk = vec![7u8; 64 << 10];
        let mut written = 0u64;
        // Fill the peer's receive buffer and ours.
        while let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(200), server.write(&chunk)).await
        {
            written += n as u64;
        }
        // The buffers may settle for a moment (window updates) before the clock runs.
        let t0 = Instant::now();
        while p.stalled_for(written) < Duration::from_millis(250) {
            assert!(t0.elapsed() < Duration::from_secs(3), "never stalled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The peer reads: progress.
        let mut buf = vec![0u8; 1 << 20];
        let _ = client.read(&mut buf).await.unwrap();
        let _ = client.read(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(p.stalled_for(written) < Duration::from_millis(250));
    }
}
