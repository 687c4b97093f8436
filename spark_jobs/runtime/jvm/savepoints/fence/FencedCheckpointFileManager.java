package savepoints.fence;

import java.io.IOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;

/**
 * Spark's checkpoint file manager with the driver's fence in front of every file it writes: a batch's offsets
 * (before the batch runs), its commit, a file sink's log entry (the file sink's commit of its output), the state
 * store's files. Named by `spark.sql.streaming.checkpointFileManagerClass`; everything is done by the manager
 * Spark would have used (`spark.savepoints.fence.delegate`, else Spark's default for the path).
 *
 * <p>The fence is checked when a file is opened for writing and again right before it is made visible (close:
 * the rename or the single PUT), so a driver paused while it wrote a file finds itself fenced when it wakes.
 */
public class FencedCheckpointFileManager implements CheckpointFileManager {
  public static final String CLASS_KEY = "spark.sql.streaming.checkpointFileManagerClass";
  public static final String DELEGATE_KEY = "spark.savepoints.fence.delegate";

  private final CheckpointFileManager delegate;
  private final Path path;

  public FencedCheckpointFileManager(Path path, Configuration hadoopConf) {
    Configuration conf = new Configuration(hadoopConf);
    String own = conf.get(DELEGATE_KEY);
    if (own == null || own.isEmpty() || own.equals(getClass().getName())) {
      conf.unset(CLASS_KEY);
    } else {
      conf.set(CLASS_KEY, own);
    }
    this.delegate = CheckpointFileManager.create(path, conf);
    this.path = path;
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path target, boolean overwriteIfPossible) {
    String what = "the commit " + target;
    try {
      Fence.check(what);
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
    CancellableFSDataOutputStream inner = delegate.createAtomic(target, overwriteIfPossible);
    return new Checked(inner, what);
  }

  @Override
  public FSDataInputStream open(Path file) {
    return delegate.open(file);
  }

  @Override
  public FileStatus[] list(Path dir, PathFilter filter) {
    return delegate.list(dir, filter);
  }

  @Override
  public void mkdirs(Path dir) {
    delegate.mkdirs(dir);
  }

  @Override
  public boolean exists(Path file) {
    return delegate.exists(file);
  }

  @Override
  public void delete(Path file) {
    delegate.delete(file);
  }

  @Override
  public boolean isLocal() {
    return delegate.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    return delegate.createCheckpointDirectory();
  }

  @Override
  public void close() {
    delegate.close();
  }

  @Override
  public String toString() {
    return "FencedCheckpointFileManager(" + path + ")";
  }

  /** The delegate's stream, made visible only after the fence is checked again. */
  private static final class Checked extends CancellableFSDataOutputStream {
    private final CancellableFSDataOutputStream inner;
    private final String what;
    private boolean done = false;

    Checked(CancellableFSDataOutputStream inner, String what) {
      super(inner);
      this.inner = inner;
      this.what = what;
    }

    @Override
    public void cancel() {
      done = true;
      inner.cancel();
    }

    @Override
    public void close() throws IOException {
      if (done) {
        return;
      }
      done = true;
      try {
        Fence.check(what);
      } catch (IOException e) {
        inner.cancel();
        throw e;
      }
      inner.close();
    }
  }
}
