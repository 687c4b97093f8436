package savepoints.fence;

import java.io.IOException;

/**
 * The fence of one driver, checked immediately before the driver writes a commit (FencedCheckpointFileManager: a
 * batch's offsets and commit, a file sink's log entry; the runtime's gated Delta writes). The driver's Python
 * runtime renews it after each read of the job's writers record that still names this deployment
 * (spark_jobs/runtime/fence.py), and supersedes it once the record no longer does.
 *
 * <p>Renewals carry the monotonic time (CLOCK_MONOTONIC, as System.nanoTime here) at which the read that
 * justified them began, so a process paused between its read and the renewal cannot extend its validity past
 * that read plus the fence interval. Unarmed (a pre-flight, a standby's warm-up, a Spark tool), nothing is
 * checked.
 */
public final class Fence {
  private static final Object LOCK = new Object();
  private static volatile boolean armed = false;
  private static volatile long validUntil = 0; // System.nanoTime() units; lapsed until the first renewal
  private static volatile boolean renewed = false;
  private static volatile long waitNanos = 0;
  private static volatile String superseded = null;

  private Fence() {}

  /** Check commits from now on; a commit waits up to `waitSeconds` for a renewal before it fails. */
  public static void arm(double waitSeconds) {
    synchronized (LOCK) {
      waitNanos = (long) (waitSeconds * 1e9);
      armed = true;
    }
  }

  /** Valid until `readStartedNanos` + `intervalSeconds`: the read that saw this deployment began then. */
  public static void renew(long readStartedNanos, double intervalSeconds) {
    synchronized (LOCK) {
      long until = readStartedNanos + (long) (intervalSeconds * 1e9);
      if (!renewed || until - validUntil > 0) {
        validUntil = until;
        renewed = true;
      }
      LOCK.notifyAll();
    }
  }

  /** Superseded for good: no commit of this driver passes again. */
  public static void supersede(String why) {
    synchronized (LOCK) {
      if (superseded == null) {
        superseded = why;
      }
      LOCK.notifyAll();
    }
  }

  public static String superseded() {
    return superseded;
  }

  public static boolean armed() {
    return armed;
  }

  /** Whether a commit may be written now (armed: renewed within the interval, not superseded). */
  public static boolean valid() {
    return !armed || (superseded == null && renewed && System.nanoTime() - validUntil < 0);
  }

  /**
   * Before a commit: return when this driver may write it; wait while its fence lapsed (the store unreachable
   * for a moment, the renewal late after a pause); throw once superseded or after the wait.
   */
  public static void check(String what) throws IOException {
    if (!armed) {
      return;
    }
    long deadline = System.nanoTime() + waitNanos;
    synchronized (LOCK) {
      while (true) {
        if (superseded != null) {
          throw new IOException("SAVEPOINTS_FENCED: " + what + " not written: " + superseded);
        }
        long now = System.nanoTime();
        if (renewed && now - validUntil < 0) {
          return;
        }
        if (now - deadline >= 0) {
          throw new IOException(
              "SAVEPOINTS_FENCED: "
                  + what
                  + " not written: this driver could not confirm within "
                  + (waitNanos / 1_000_000_000L)
                  + " s that it is still the job's writer (the store unreachable, or the driver paused)");
        }
        try {
          LOCK.wait(Math.max(1L, Math.min(200L, (deadline - now) / 1_000_000L)));
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IOException("SAVEPOINTS_FENCED: interrupted while " + what + " waited for the fence", e);
        }
      }
    }
  }
}
