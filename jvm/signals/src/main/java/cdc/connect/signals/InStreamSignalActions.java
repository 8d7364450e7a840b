package cdc.connect.signals;

import io.debezium.config.CommonConnectorConfig;
import io.debezium.pipeline.ChangeEventSourceCoordinator;
import io.debezium.pipeline.EventDispatcher;
import io.debezium.pipeline.signal.actions.SignalAction;
import io.debezium.pipeline.signal.actions.SignalActionProvider;
import io.debezium.pipeline.signal.actions.snapshotting.ExecuteSnapshot;
import io.debezium.pipeline.signal.actions.snapshotting.ResumeIncrementalSnapshot;
import io.debezium.pipeline.spi.Partition;
import io.debezium.spi.schema.DataCollectionId;
import java.util.Map;

/**
 * Two signals a read-only backfill sends through Kafka instead of Debezium's own
 * {@code execute-snapshot} and {@code resume-snapshot}: the same actions, whose chunk
 * read is run by the streaming thread ({@link InStreamSnapshots}).
 */
public class InStreamSignalActions implements SignalActionProvider {

  public static final String EXECUTE = "cdc-execute-snapshot";
  public static final String RESUME = "cdc-resume-snapshot";

  @Override
  public <P extends Partition> Map<String, SignalAction<P>> createActions(
      EventDispatcher<P, ? extends DataCollectionId> dispatcher,
      ChangeEventSourceCoordinator<P, ?> coordinator,
      CommonConnectorConfig config) {
    ExecuteSnapshot<P> execute = new ExecuteSnapshot<>(dispatcher, coordinator);
    ResumeIncrementalSnapshot<P> resume = new ResumeIncrementalSnapshot<>(dispatcher);
    SignalAction<P> inStreamExecute =
        payload -> {
          InStreamSnapshots.install(dispatcher);
          return execute.arrived(payload);
        };
    SignalAction<P> inStreamResume =
        payload -> {
          InStreamSnapshots.install(dispatcher);
          return resume.arrived(payload);
        };
    return Map.of(EXECUTE, inStreamExecute, RESUME, inStreamResume);
  }
}
