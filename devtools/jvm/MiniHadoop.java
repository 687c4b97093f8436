// HDFS and YARN in one JVM for tests and the demo, started by devtools/hadoop.py with Java's source-file
// launcher (`java -cp <hadoop-minicluster jars> MiniHadoop.java SETTINGS READY`): nothing is compiled ahead.
//
// SETTINGS is a properties file: every key is set in the clusters' Hadoop configuration (devtools/hadoop.py
// chooses the addresses, all on 127.0.0.1, and the small container sizes), except the `minihadoop.*` keys,
// which say where the NameNode listens and where the clusters keep their files. Once the NameNode, the
// DataNode, the ResourceManager and the NodeManager are up, the file READY is written (atomically). The JVM
// then runs until SIGTERM, or until its standard input closes (the Python that started it is gone), and stops
// YARN first (the NodeManager ends the containers it runs), then HDFS.
import java.io.File;
import java.io.FileReader;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Properties;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

public class MiniHadoop {
    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable e) { // HDFS's threads would keep a JVM whose start failed alive: end it
            e.printStackTrace();
            System.exit(1);
        }
    }

    /**
     * Stops YARN; after `millis` its stop is interrupted until it ends. The NodeManager kills its containers
     * first (in well under a second with devtools/hadoop.py's settings); its log handler then waits 10 s for
     * the deletion of logs it was told to keep for hours, of a cluster whose directory is deleted next.
     */
    private static void stopWithin(MiniYARNCluster yarn, long millis) {
        Thread stopper = new Thread(yarn::stop, "stop-yarn");
        stopper.start();
        try {
            stopper.join(millis);
            while (stopper.isAlive()) {
                stopper.interrupt();
                stopper.join(200);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static void run(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: MiniHadoop SETTINGS READY");
            System.exit(2);
        }
        Properties settings = new Properties();
        try (Reader reader = new FileReader(args[0], StandardCharsets.UTF_8)) {
            settings.load(reader);
        }
        Configuration conf = new YarnConfiguration();
        for (String key : settings.stringPropertyNames()) {
            if (!key.startsWith("minihadoop.")) {
                conf.set(key, settings.getProperty(key));
            }
        }
        MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf, new File(settings.getProperty("minihadoop.dfs.dir")))
                .nameNodePort(Integer.parseInt(settings.getProperty("minihadoop.namenode.port")))
                .nameNodeHttpPort(Integer.parseInt(settings.getProperty("minihadoop.namenode.http.port")))
                .numDataNodes(1)
                .build();
        dfs.waitActive();
        conf.set("fs.defaultFS", dfs.getFileSystem().getUri().toString()); // YARN's staging and logs go to HDFS
        MiniYARNCluster yarn = new MiniYARNCluster("minihadoop", 1, 1, 1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                stopWithin(yarn, 3_000);
            } finally {
                dfs.shutdown();
            }
        }));
        yarn.init(conf);
        yarn.start();
        if (!yarn.waitForNodeManagersToConnect(120_000)) {
            throw new IllegalStateException("the NodeManager did not register with the ResourceManager in 120 s");
        }
        Path ready = Path.of(args[1]);
        Path partial = ready.resolveSibling(ready.getFileName() + ".tmp");
        Files.writeString(partial, dfs.getFileSystem().getUri() + "\n");
        Files.move(partial, ready, StandardCopyOption.ATOMIC_MOVE);
        System.out.println("MiniHadoop ready: " + dfs.getFileSystem().getUri());
        while (System.in.read() != -1) {
            // runs until the parent closes our standard input (or SIGTERM ends the JVM)
        }
        System.exit(0);
    }
}
