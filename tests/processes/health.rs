//! Leadership follows the app, with whole processes: three sidecars on the
//! emulator, each polling a small test "app" (an HTTP server the test
//! switches between 200 and 500) as its health URL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INTERVAL: Duration = Duration::from_millis(100);
const FAILURES: u32 = 2;

/// An app whose health endpoint answers 200 while `healthy`, else 500.
struct App {
    port: u16,
    healthy: Arc<AtomicBool>,
}

fn start_app(runtime: &tokio::runtime::Runtime) -> App {
    let healthy = Arc::new(AtomicBool::new(true));
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let flag = healthy.clone();
    runtime.spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let flag = flag.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let status = if flag.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "500 Internal Server Error"
                };
                let _ = stream
                    .write_all(
                        format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
                    )
                    .await;
            });
        }
    });
    App { port, healthy }
}

#[test]
fn leadership_follows_the_apps_health() {
    let apps_runtime = proxy_runtime();
    let apps: Vec<App> = (0..3).map(|_| start_app(&apps_runtime)).collect();
    let ports: Vec<u16> = apps.iter().map(|a| a.port).collect();
    let cluster = cluster_with("health", |i| {
        vec![
            "--app-health-url".into(),
            format!("http://127.0.0.1:{}/healthz", ports[i]),
            "--app-health-interval".into(),
            "100ms".into(),
            "--app-health-timeout".into(),
            "200ms".into(),
            "--app-health-failures".into(),
            FAILURES.to_string(),
        ]
    });
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let (_, view) = cluster.sidecars[first].leader();
    assert_eq!(view["appHealthy"], true, "{view}");

    // The leader's app fails: it releases after its drain window and a
    // follower with a healthy app takes over.
    apps[first].healthy.store(false, Ordering::SeqCst);
    let failed = Instant::now();
    let rest = others(&cluster.sidecars, first);
    let detection = INTERVAL * (FAILURES + 1);
    let next = wait_for_one_leader(&rest, detection + DRAIN + P + Duration::from_millis(700))
        .expect("a follower with a healthy app leads");
    println!(
        "handover after the app failed: {:?} (detection {detection:?}, drain {DRAIN:?}, P {P:?})",
        failed.elapsed()
    );
    let (status, view) = cluster.sidecars[first].leader();
    assert_eq!(status, 503);
    assert_eq!(view["appHealthy"], false, "{view}");
    assert_eq!(view["campaigning"], false, "{view}");
    assert!(view["appHealth"].as_str().unwrap().contains("answered 500"), "{view}");

    // Every app fails: nobody leads.
    for app in &apps {
        app.healthy.store(false, Ordering::SeqCst);
    }
    let new_leader = rest[next];
    let all_failed = Instant::now();
    while new_leader.leads() {
        assert!(
            all_failed.elapsed() < detection + DRAIN + Duration::from_secs(2),
            "the last leader keeps leading an unhealthy app"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let quiet = Instant::now();
    while quiet.elapsed() < D + P {
        assert!(
            cluster.sidecars.iter().all(|s| !s.leads()),
            "someone leads although every app is unhealthy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Heal one: it leads.
    let healed = (first + 1) % 3;
    apps[healed].healthy.store(true, Ordering::SeqCst);
    let only = [&cluster.sidecars[healed]];
    wait_for_one_leader(&only, INTERVAL * 2 + P + Duration::from_secs(1)).expect("the healed one leads");
    assert!(
        cluster
            .sidecars
            .iter()
            .enumerate()
            .all(|(i, s)| i == healed || !s.leads())
    );
}
