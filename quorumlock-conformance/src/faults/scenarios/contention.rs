//! Contention without a store fault: plain, with connection resets during acquires, with cancelled acquires.

use super::*;

/// Several clients, two owners each, contend with no fault.
pub async fn contention_no_fault(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "contention_no_fault").await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(s.client().await);
    }
    let cycles = Arc::new(AtomicU64::new(0));
    let mut round = 0;
    while s.more(round) {
        let mut tasks = Vec::new();
        for (ci, c) in clients.iter().enumerate() {
            for k in 0..2 {
                let (c, h, r, n) = (
                    c.clone(),
                    s.history.clone(),
                    s.register.clone(),
                    cycles.clone(),
                );
                let within = s.soon();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..4 {
                        cycle(
                            &c,
                            &format!("c{ci}.{k}"),
                            &h,
                            &r,
                            Duration::from_millis(2),
                            within,
                        )
                        .await
                        .expect("a cycle without faults failed");
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("contender panicked");
        }
        round += 1;
    }
    s.row.cycles = cycles.load(Ordering::Relaxed);
    s.finish().await
}

/// Connections reset at random moments while clients acquire: never two
/// entries of one session, never two holders, nothing left behind.
pub async fn reset_during_acquire(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "reset_during_acquire").await;
    let mut clients = Vec::new();
    let mut nets = Vec::new();
    for _ in 0..2 {
        let (c, n) = s.faulty().await;
        clients.push(c);
        nets.push(n);
    }
    clients.push(s.client().await);
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let run_for = s.budget.max(Duration::from_secs(3));
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for k in 0..2 {
            let (c, h, r) = (c.clone(), s.history.clone(), s.register.clone());
            let (stop, cycles, errors) = (stop.clone(), cycles.clone(), errors.clone());
            let within = s.soon();
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match cycle(
                        &c,
                        &format!("c{ci}.{k}"),
                        &h,
                        &r,
                        Duration::from_millis(3),
                        within,
                    )
                    .await
                    {
                        Ok(()) => cycles.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
    }
    let injector = {
        let (nets, stop) = (nets.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(5 + rand_below(60))).await;
                nets[rand_below(nets.len() as u64) as usize].pulse_reset();
            }
        })
    };
    // Watch the store for duplicates while the faults run.
    let started = Instant::now();
    let mut dup_seen = Vec::new();
    let mut holders_seen = 0;
    while started.elapsed() < run_for {
        if let Ok(st) = s.admin.inspect(LOCK).await {
            holders_seen = holders_seen.max(st.holders.len());
            let mut sessions: Vec<&str> = st
                .holders
                .iter()
                .chain(st.waiters.iter())
                .map(|c| c.session.as_str())
                .collect();
            sessions.sort();
            if sessions.windows(2).any(|w| w[0] == w[1]) && dup_seen.len() < 3 {
                dup_seen.push(format!("{st:?}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    injector.await.expect("injector panicked");
    for task in tasks {
        task.await.expect("contender panicked");
    }
    for d in dup_seen {
        s.row.violation(format!("two entries of one session: {d}"));
    }
    if holders_seen > 1 {
        s.row
            .violation(format!("{holders_seen} holders of a mutex at once"));
    }
    s.row.cycles = cycles.load(Ordering::Relaxed);
    s.row.note(format!(
        "{} acquire attempts failed",
        errors.load(Ordering::Relaxed)
    ));
    if s.row.cycles == 0 {
        s.row.violation("no cycle completed under resets");
    }
    s.finish().await
}

/// Acquire futures dropped at random moments under contention; some
/// guards dropped instead of released. Nothing may be left behind.
pub async fn cancelled_acquires_under_contention(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "cancelled_acquires_under_contention").await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(s.client().await);
    }
    let cycles = Arc::new(AtomicU64::new(0));
    let cancels = Arc::new(AtomicU64::new(0));
    let mut round = 0;
    while s.more(round) {
        let mut tasks = Vec::new();
        for (ci, c) in clients.iter().enumerate() {
            for k in 0..3 {
                let (c, h, r) = (c.clone(), s.history.clone(), s.register.clone());
                let (cycles, cancels) = (cycles.clone(), cancels.clone());
                tasks.push(tokio::spawn(async move {
                    let who = format!("c{ci}.{k}");
                    let lock = c.lock(LOCK).unwrap();
                    for _ in 0..15 {
                        let patience = Duration::from_millis(rand_below(40));
                        match tokio::time::timeout(patience, lock.acquire()).await {
                            Err(_) => {
                                cancels.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Err(e)) => panic!("acquire failed: {e}"),
                            Ok(Ok(g)) => {
                                let tr = h.track(&who, &g);
                                if g.is_held() {
                                    let _ = r.write(&who, g.token());
                                }
                                tokio::time::sleep(Duration::from_millis(1 + rand_below(4))).await;
                                tr.releasing();
                                if rand_below(3) == 0 {
                                    drop(g);
                                } else {
                                    let _ = g.release().await;
                                }
                                cycles.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("contender panicked");
        }
        round += 1;
    }
    for c in &clients {
        tokio::time::timeout(s.soon(), c.wait_idle())
            .await
            .expect("cleanup stuck");
    }
    // The lock is free again: no phantom holder or waiter.
    match s.admin.inspect(LOCK).await {
        Ok(st) if st.is_free() => {}
        other => s
            .row
            .violation(format!("lock not free after the cancellations: {other:?}")),
    }
    s.row.cycles = cycles.load(Ordering::Relaxed);
    s.row.faults = cancels.load(Ordering::Relaxed);
    s.finish().await
}
