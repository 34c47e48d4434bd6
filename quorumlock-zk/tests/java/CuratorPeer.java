// A Curator peer for quorumlock-zk's interop test: reads commands on stdin,
// one per line, and answers on stdout. Locks are Curator's own
// InterProcessMutex and InterProcessReadWriteLock; each named lock lives on
// its own thread because Curator's locks are owned by the thread that
// acquired them.
//
//   lock <id> <path>          new InterProcessMutex on <path>, made revocable
//   rwlock <id> <path> <side> the read or write side (<side> = read|write)
//                             of a new InterProcessReadWriteLock on <path>
//   semaphore <id> <path> <n> new InterProcessSemaphoreV2 on <path> with n
//                             leases; "acquire <id>" takes one lease,
//                             "release <id>" returns it
//   acquire <id>              -> "acquired <id> <nodePath>" once held ("-" for
//                             the node of a read-write lock side)
//   acquire-many <id> <qty>   semaphore only: acquire(qty) -> "acquired <id>"
//                             once all qty leases are held
//   release <id>              -> "released <id>"
//   revoke <nodePath>         Revoker.attemptRevoke -> "revoked"
//   rounds <path> <n> <file>  n times: acquire, append "start curator <i>",
//                             hold briefly, append "end curator <i>", release
//                             -> "rounds-done"
//   quit
//
// Asynchronous events: "revoke-requested <id>" from the RevocationListener.
import java.io.BufferedReader;
import java.io.FileWriter;
import java.io.InputStreamReader;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.locks.Revoker;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    static class Mutex extends InterProcessMutex {
        Mutex(CuratorFramework c, String path) { super(c, path); }
        String ourPath() { return getLockPath(); }
    }

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static synchronized void append(String file, String line) throws Exception {
        try (FileWriter w = new FileWriter(file, true)) {
            w.write(line + "\n");
        }
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(args[0])
            .sessionTimeoutMs(4000)
            .connectionTimeoutMs(4000)
            .retryPolicy(new RetryNTimes(10, 100))
            .build();
        client.start();
        client.blockUntilConnected();
        Map<String, InterProcessMutex> locks = new ConcurrentHashMap<>();
        Map<String, ExecutorService> threads = new ConcurrentHashMap<>();
        Map<String, InterProcessSemaphoreV2> semaphores = new ConcurrentHashMap<>();
        Map<String, Lease> leases = new ConcurrentHashMap<>();
        Map<String, java.util.Collection<Lease>> leaseSets = new ConcurrentHashMap<>();
        ExecutorService background = Executors.newCachedThreadPool();
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split(" ");
            try {
                switch (w[0]) {
                    case "lock": {
                        String id = w[1];
                        Mutex m = new Mutex(client, w[2]);
                        m.makeRevocable(lock -> say("revoke-requested " + id));
                        locks.put(id, m);
                        threads.put(id, Executors.newSingleThreadExecutor());
                        say("ok");
                        break;
                    }
                    case "rwlock": {
                        String id = w[1];
                        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, w[2]);
                        locks.put(id, w[3].equals("read") ? rw.readLock() : rw.writeLock());
                        threads.put(id, Executors.newSingleThreadExecutor());
                        say("ok");
                        break;
                    }
                    case "semaphore": {
                        String id = w[1];
                        semaphores.put(id, new InterProcessSemaphoreV2(client, w[2], Integer.parseInt(w[3])));
                        threads.put(id, Executors.newSingleThreadExecutor());
                        say("ok");
                        break;
                    }
                    case "acquire-many": {
                        String id = w[1];
                        int qty = Integer.parseInt(w[2]);
                        threads.get(id).submit(() -> {
                            try {
                                leaseSets.put(id, semaphores.get(id).acquire(qty));
                                say("acquired " + id);
                            } catch (Exception e) {
                                say("error " + e);
                            }
                        });
                        break;
                    }
                    case "acquire": {
                        String id = w[1];
                        if (semaphores.containsKey(id)) {
                            threads.get(id).submit(() -> {
                                try {
                                    Lease l = semaphores.get(id).acquire();
                                    leases.put(id, l);
                                    say("acquired " + id + " " + l.getNodeName());
                                } catch (Exception e) {
                                    say("error " + e);
                                }
                            });
                            break;
                        }
                        InterProcessMutex m = locks.get(id);
                        threads.get(id).submit(() -> {
                            try {
                                m.acquire();
                                String node = (m instanceof Mutex) ? ((Mutex) m).ourPath() : "-";
                                say("acquired " + id + " " + node);
                            } catch (Exception e) {
                                say("error " + e);
                            }
                        });
                        break;
                    }
                    case "release": {
                        String id = w[1];
                        if (semaphores.containsKey(id)) {
                            threads.get(id).submit(() -> {
                                try {
                                    if (leaseSets.containsKey(id)) {
                                        semaphores.get(id).returnAll(leaseSets.remove(id));
                                    } else {
                                        leases.remove(id).close();
                                    }
                                    say("released " + id);
                                } catch (Exception e) {
                                    say("error " + e);
                                }
                            });
                            break;
                        }
                        InterProcessMutex m = locks.get(id);
                        threads.get(id).submit(() -> {
                            try {
                                m.release();
                                say("released " + id);
                            } catch (Exception e) {
                                say("error " + e);
                            }
                        });
                        break;
                    }
                    case "revoke":
                        Revoker.attemptRevoke(client, w[1]);
                        say("revoked");
                        break;
                    case "rounds": {
                        String path = w[1];
                        int n = Integer.parseInt(w[2]);
                        String file = w[3];
                        background.submit(() -> {
                            try {
                                InterProcessMutex m = new InterProcessMutex(client, path);
                                for (int i = 0; i < n; i++) {
                                    m.acquire();
                                    append(file, "start curator " + i);
                                    Thread.sleep(5);
                                    append(file, "end curator " + i);
                                    m.release();
                                }
                                say("rounds-done");
                            } catch (Exception e) {
                                say("error " + e);
                            }
                        });
                        break;
                    }
                    case "quit":
                        client.close();
                        say("bye");
                        System.exit(0);
                        break;
                    default:
                        say("error unknown command " + w[0]);
                }
            } catch (Exception e) {
                say("error " + e);
            }
        }
        client.close();
        System.exit(0);
    }
}
