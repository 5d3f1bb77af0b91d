"""The wire protocol: protobuf messages (`pb`, generated from `proto/magic/v1/messages.proto`), their
stream-entry codec, and the names of every Redis key and consumer group. Pure data: nothing here
talks to Redis (that is `magic.store`)."""
