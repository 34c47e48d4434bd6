// A Curator LeaderLatch peer for quorumlock-zk's election interop test: reads
// commands on stdin, one per line, and answers on stdout.
//
//   latch <id> <path> <participant>  new LeaderLatch on <path> with that
//                                    participant id, started -> "started <id>"
//   close <id>                       latch.close() (resigns) -> "closed <id>"
//   leader <id>                      -> "leaderis <id> <participant id>" as
//                                    that latch's getLeader() reads it
//   watches                          -> "watches <path>,<path>,..." the data
//                                    watches the client's ZooKeeper handle
//                                    has set (a latch's on its predecessor)
//   quit                             -> "bye"
//
// Asynchronous events: "leader <id>" and "notleader <id>" from the latch's
// listener.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.retry.RetryNTimes;

public class LatchPeer {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
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
        Map<String, LeaderLatch> latches = new ConcurrentHashMap<>();
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split(" ");
            try {
                switch (w[0]) {
                    case "latch": {
                        final String id = w[1];
                        LeaderLatch l = new LeaderLatch(client, w[2], w[3]);
                        l.addListener(new LeaderLatchListener() {
                            public void isLeader() { say("leader " + id); }
                            public void notLeader() { say("notleader " + id); }
                        });
                        latches.put(id, l);
                        l.start();
                        say("started " + id);
                        break;
                    }
                    case "close": {
                        latches.remove(w[1]).close();
                        say("closed " + w[1]);
                        break;
                    }
                    case "leader": {
                        say("leaderis " + w[1] + " " + latches.get(w[1]).getLeader().getId());
                        break;
                    }
                    case "watches": {
                        // ZooKeeper.getDataWatches() is protected (for
                        // tests): read it by reflection.
                        Object zk = client.getZookeeperClient().getZooKeeper();
                        java.lang.reflect.Method m =
                            org.apache.zookeeper.ZooKeeper.class.getDeclaredMethod("getDataWatches");
                        m.setAccessible(true);
                        @SuppressWarnings("unchecked")
                        java.util.List<String> paths = (java.util.List<String>) m.invoke(zk);
                        say("watches " + String.join(",", paths));
                        break;
                    }
                    case "quit": {
                        for (LeaderLatch l : latches.values()) l.close();
                        client.close();
                        say("bye");
                        return;
                    }
                    default:
                        say("error unknown command " + w[0]);
                }
            } catch (Exception e) {
                say("error " + e);
            }
        }
    }
}
