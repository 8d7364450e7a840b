package cdc.connect.signals;

import io.debezium.pipeline.EventDispatcher;
import io.debezium.pipeline.signal.SignalPayload;
import io.debezium.pipeline.signal.actions.snapshotting.SnapshotConfiguration;
import io.debezium.pipeline.source.snapshot.incremental.IncrementalSnapshotChangeEventSource;
import io.debezium.pipeline.spi.OffsetContext;
import io.debezium.pipeline.spi.Partition;
import io.debezium.spi.schema.DataCollectionId;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Debezium's incremental snapshot, with the start and the resume of a backfill run by the
 * streaming thread.
 *
 * <p>A signal read from Kafka (read.only backfills) is run by Debezium's signal thread, and
 * its action reads the backfill's first chunk there, while the streaming thread goes on
 * dispatching changes against the same window. A change of a key the chunk read before it
 * was committed, dispatched before the chunk's row of that key reached the window, is not
 * dropped from the chunk: the row as it was before the change then lands in the log after
 * it (seen under load: a deleted key backfilled again after its delete). And a change
 * dispatched while the signal thread waits for its low watermark finds the window closed,
 * so the streaming thread reads a chunk of its own at the same time.
 *
 * <p>Here the signal thread only hands the start (or the resume) over and waits for it: the
 * streaming thread runs it at its next change, commit or idle poll, before it dispatches
 * anything else, as it runs every later chunk. Everything else goes to Debezium's own
 * source unchanged.
 */
public final class InStreamSnapshots<P extends Partition, T extends DataCollectionId>
    implements IncrementalSnapshotChangeEventSource<P, T> {

  private static final Logger LOG = LoggerFactory.getLogger(InStreamSnapshots.class);

  @FunctionalInterface
  private interface Step<P> {
    void run(P partition, OffsetContext offsets) throws InterruptedException;
  }

  private record Handed<P>(String what, Step<P> step, CompletableFuture<Void> done) {}

  private final IncrementalSnapshotChangeEventSource<P, T> debezium;
  private final ConcurrentLinkedQueue<Handed<P>> handed = new ConcurrentLinkedQueue<>();
  private volatile Thread streaming;

  private InStreamSnapshots(IncrementalSnapshotChangeEventSource<P, T> debezium) {
    this.debezium = debezium;
  }

  /** Put this in front of the dispatcher's incremental snapshot source, once. */
  static synchronized <P extends Partition, T extends DataCollectionId> void install(
      EventDispatcher<P, T> dispatcher) {
    IncrementalSnapshotChangeEventSource<P, T> current =
        dispatcher.getIncrementalSnapshotChangeEventSource();
    if (current == null || current instanceof InStreamSnapshots) {
      return; // none configured (the action says so), or already in front
    }
    dispatcher.setIncrementalSnapshotChangeEventSource(
        Optional.<IncrementalSnapshotChangeEventSource<P, ? extends DataCollectionId>>of(
            new InStreamSnapshots<>(current)));
    LOG.info("backfill signals from Kafka are run by the streaming thread");
  }

  @Override
  public void addDataCollectionNamesToSnapshot(
      SignalPayload<P> signal, SnapshotConfiguration configuration) throws InterruptedException {
    hand(
        "backfill " + signal.id,
        (partition, offsets) ->
            debezium.addDataCollectionNamesToSnapshot(
                new SignalPayload<>(
                    partition, signal.id, signal.type, signal.data, offsets, signal.additionalData),
                configuration));
  }

  @Override
  public void resumeSnapshot(P partition, OffsetContext offsets) throws InterruptedException {
    hand("resume", debezium::resumeSnapshot);
  }

  /** Run `step` on the streaming thread and wait for it (the signal is taken after it). */
  private void hand(String what, Step<P> step) throws InterruptedException {
    if (Thread.currentThread() == streaming) {
      throw new IllegalStateException(what + " handed over by the streaming thread itself");
    }
    Handed<P> item = new Handed<>(what, step, new CompletableFuture<>());
    handed.add(item);
    long waited = 0;
    while (true) {
      try {
        item.done().get(30, TimeUnit.SECONDS);
        return;
      } catch (TimeoutException e) {
        waited += 30;
        LOG.warn("{}: the streaming thread has not taken it after {} s", what, waited);
      } catch (ExecutionException e) {
        Throwable cause = e.getCause();
        if (cause instanceof InterruptedException interrupted) {
          throw interrupted;
        }
        if (cause instanceof RuntimeException runtime) {
          throw runtime;
        }
        throw new IllegalStateException(what + " failed", cause);
      }
    }
  }

  /** On the streaming thread: run what the signal thread handed over, in order. */
  private void runHanded(P partition, OffsetContext offsets) throws InterruptedException {
    streaming = Thread.currentThread();
    Handed<P> item;
    while ((item = handed.poll()) != null) {
      LOG.info("{}: run by the streaming thread", item.what());
      try {
        item.step().run(partition, offsets);
        item.done().complete(null);
      } catch (InterruptedException e) {
        item.done().completeExceptionally(e);
        throw e;
      } catch (RuntimeException e) {
        item.done().completeExceptionally(e);
      }
    }
  }

  @Override
  public void processMessage(
      P partition, DataCollectionId dataCollectionId, Object key, OffsetContext offsets)
      throws InterruptedException {
    runHanded(partition, offsets);
    debezium.processMessage(partition, dataCollectionId, key, offsets);
  }

  @Override
  public void processHeartbeat(P partition, OffsetContext offsets) throws InterruptedException {
    runHanded(partition, offsets);
    debezium.processHeartbeat(partition, offsets);
  }

  @Override
  public void processFilteredEvent(P partition, OffsetContext offsets)
      throws InterruptedException {
    runHanded(partition, offsets);
    debezium.processFilteredEvent(partition, offsets);
  }

  @Override
  public void processTransactionStartedEvent(P partition, OffsetContext offsets)
      throws InterruptedException {
    runHanded(partition, offsets);
    debezium.processTransactionStartedEvent(partition, offsets);
  }

  @Override
  public void processTransactionCommittedEvent(P partition, OffsetContext offsets)
      throws InterruptedException {
    runHanded(partition, offsets);
    debezium.processTransactionCommittedEvent(partition, offsets);
  }

  @Override
  public void processSchemaChange(
      P partition, OffsetContext offsets, DataCollectionId dataCollectionId)
      throws InterruptedException {
    debezium.processSchemaChange(partition, offsets, dataCollectionId);
  }

  @Override
  public void closeWindow(P partition, String id, OffsetContext offsets)
      throws InterruptedException {
    debezium.closeWindow(partition, id, offsets);
  }

  @Override
  public void pauseSnapshot(P partition, OffsetContext offsets) throws InterruptedException {
    debezium.pauseSnapshot(partition, offsets);
  }

  @Override
  public void init(P partition, OffsetContext offsets) {
    debezium.init(partition, offsets);
  }

  @Override
  public void requestStopSnapshot(
      P partition,
      OffsetContext offsets,
      Map<String, Object> additionalData,
      List<String> dataCollectionIds) {
    debezium.requestStopSnapshot(partition, offsets, additionalData, dataCollectionIds);
  }
}
