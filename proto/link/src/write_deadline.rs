//! A connection whose writes must make progress: a write (or flush) that stays blocked for the
//! timeout fails with `TimedOut`, and the HTTP connection ends. A client that stops reading
//! then cannot hold a response, its buffers and its handler's memory for longer than that,
//! whether the response is streamed or whole (streams also judge their client sooner, by what
//! the socket says it acknowledged).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

pub struct WriteDeadline<S> {
    inner: S,
    timeout: Duration,
    /// Running while a write is blocked; reset by any progress.
    blocked: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            blocked: None,
        }
    }

    /// Passes a finished write through (and forgets the block); while it is blocked, fails it
    /// once the timeout has run.
    fn judge<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.blocked = None;
            return poll;
        }
        let timeout = self.timeout;
        let blocked = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match blocked.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.judge(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.judge(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.judge(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.judge(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_secs(30);

    /// A pipe nobody reads: writes succeed until its buffer is full, then the blocked write
    /// fails once the timeout has run.
    #[tokio::test(start_paused = true)]
    async fn a_write_blocked_for_the_timeout_fails() {
        let (_client, server) = tokio::io::duplex(1024);
        let mut server = WriteDeadline::new(server, TIMEOUT);
        let chunk = [7u8; 256];
        for _ in 0..4 {
            server.write_all(&chunk).await.unwrap();
        }
        let started = tokio::time::Instant::now();
        let err = server.write_all(&chunk).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), TIMEOUT);
    }

    /// A slow but steady reader (20 s between reads, each under the timeout) is never cut
    /// off, though the writer is blocked most of the time: progress resets the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_slow_steady_reader_is_not_cut_off() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut server = WriteDeadline::new(server, TIMEOUT);
        let total = 16 * 1024;
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let mut read = 0;
            while read < total {
                tokio::time::sleep(Duration::from_secs(20)).await;
                read += client.read(&mut buf).await.unwrap();
            }
            read
        });
        server.write_all(&vec![7u8; total]).await.unwrap();
        assert_eq!(reading.await.unwrap(), total);
    }
}
