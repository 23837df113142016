// Transitions of a session stream's flow control (stream_flow.h), without gRPC.
#include "server/rpc/stream_flow.h"

#include "gtest/gtest.h"

namespace offloadd::rpc {
namespace {

using Read = StreamFlow::Read;
using Write = StreamFlow::Write;
using Stream = StreamFlow::Stream;
using AfterSlice = StreamFlow::AfterSlice;

TEST(StreamFlowTest, AMessageIsHandledThenTheNextReadStarts) {
  StreamFlow f;
  f.Start();
  EXPECT_EQ(f.read(), Read::kReading);
  f.ReadDone(true);
  EXPECT_EQ(f.read(), Read::kHandling);
  EXPECT_EQ(f.SliceDone(/*more=*/true, /*queue_full=*/false), AfterSlice::kNextSlice);
  EXPECT_EQ(f.SliceDone(false, false), AfterSlice::kStartRead);
  EXPECT_EQ(f.read(), Read::kReading);
  EXPECT_EQ(f.stream(), Stream::kOpen);
}

TEST(StreamFlowTest, OneWriteInFlightAndAnswersMeanwhileWaitForIt) {
  StreamFlow f;
  f.Start();
  ASSERT_TRUE(f.AcceptsAnswers());
  EXPECT_TRUE(f.AnswerQueued());  // idle: start a write
  f.WriteStarted();
  EXPECT_EQ(f.write(), Write::kInFlight);
  EXPECT_FALSE(f.AnswerQueued());  // joins the next batch
  EXPECT_FALSE(f.WriteDone(true));
  EXPECT_EQ(f.write(), Write::kIdle);
}

TEST(StreamFlowTest, AFullQueuePausesReadingUntilAWriteCompletes) {
  StreamFlow f;
  f.Start();
  f.ReadDone(true);
  f.AnswerQueued();
  f.WriteStarted();
  EXPECT_EQ(f.SliceDone(/*more=*/true, /*queue_full=*/true), AfterSlice::kPause);
  EXPECT_EQ(f.read(), Read::kPaused);
  EXPECT_FALSE(f.WriteDone(true));
  f.WriteStarted();  // the next batch
  EXPECT_FALSE(f.ResumeAfterWrite(/*queue_below_limit=*/false));
  EXPECT_EQ(f.read(), Read::kPaused);
  EXPECT_FALSE(f.WriteDone(true));
  EXPECT_TRUE(f.ResumeAfterWrite(true));
  EXPECT_EQ(f.read(), Read::kHandling);
  EXPECT_FALSE(f.ResumeAfterWrite(true));  // once
}

TEST(StreamFlowTest, AFullQueueWithoutAWriteInFlightDoesNotPause) {
  StreamFlow f;
  f.Start();
  f.ReadDone(true);
  EXPECT_EQ(f.SliceDone(true, /*queue_full=*/true), AfterSlice::kNextSlice);
}

TEST(StreamFlowTest, HalfCloseFinishesAfterTheWriteInFlightAndTheQueue) {
  StreamFlow f;
  f.Start();
  f.AnswerQueued();
  f.WriteStarted();
  f.ReadDone(false);  // the client half-closed
  EXPECT_EQ(f.read(), Read::kClosed);
  EXPECT_EQ(f.stream(), Stream::kFinishing);
  EXPECT_FALSE(f.TakeFinish(/*queue_empty=*/true));  // a write is in flight
  EXPECT_TRUE(f.AcceptsAnswers());  // answers of requests still running go out
  f.WriteDone(true);
  EXPECT_FALSE(f.TakeFinish(/*queue_empty=*/false));
  f.WriteStarted();
  f.WriteDone(true);
  EXPECT_TRUE(f.TakeFinish(true));
  EXPECT_EQ(f.stream(), Stream::kFinished);
  EXPECT_FALSE(f.TakeFinish(true));  // Finish exactly once
  EXPECT_FALSE(f.AcceptsAnswers());
}

TEST(StreamFlowTest, AFailedWriteDropsAnswersAndFinishesWithoutWaiting) {
  StreamFlow f;
  f.Start();
  f.AnswerQueued();
  f.WriteStarted();
  EXPECT_TRUE(f.WriteDone(false));  // drop the queue
  EXPECT_EQ(f.write(), Write::kBroken);
  EXPECT_FALSE(f.AcceptsAnswers());
  f.ReadDone(false);
  EXPECT_TRUE(f.TakeFinish(true));
}

TEST(StreamFlowTest, TheDaemonEndingTheSessionStopsHandlingAndAPausedRead) {
  StreamFlow f;
  f.Start();
  f.ReadDone(true);
  f.AnswerQueued();
  f.WriteStarted();
  ASSERT_EQ(f.SliceDone(true, true), AfterSlice::kPause);
  f.RequestFinish();  // EndStream: admin call, process exited
  EXPECT_FALSE(f.WriteDone(true));
  EXPECT_FALSE(f.ResumeAfterWrite(true));  // no more requests handled
  EXPECT_TRUE(f.TakeFinish(true));
  EXPECT_EQ(f.SliceDone(true, false), AfterSlice::kStop);
}

TEST(StreamFlowTest, AnUnparsableMessageClosesTheReadSide) {
  StreamFlow f;
  f.Start();
  f.ReadFailed();
  EXPECT_EQ(f.read(), Read::kClosed);
  EXPECT_EQ(f.stream(), Stream::kOpen);  // the session's end requests finishing
  f.RequestFinish();
  EXPECT_TRUE(f.TakeFinish(true));
}

TEST(StreamFlowTest, ASessionThatCannotOpenFinishesAtOnceOnce) {
  StreamFlow f;
  EXPECT_TRUE(f.FinishAtOnce());
  EXPECT_EQ(f.stream(), Stream::kFinished);
  EXPECT_FALSE(f.FinishAtOnce());
  EXPECT_FALSE(f.TakeFinish(true));
}

using Route = StreamFlow::Route;

TEST(StreamFlowRouteTest, OnlyAMessageOfNonBlockingRequestsRunsOnTheReaction) {
  StreamFlow f;
  f.Start();
  f.ReadDone(true);
  EXPECT_EQ(f.RouteMessage(1, /*none_may_block=*/true), Route::kInline);
  EXPECT_EQ(f.RouteMessage(1, /*none_may_block=*/false), Route::kWorker);
  EXPECT_EQ(f.RouteMessage(StreamFlow::kMaxInlineRequests, true), Route::kInline);
  EXPECT_EQ(f.RouteMessage(StreamFlow::kMaxInlineRequests + 1, true), Route::kWorker);
}

// A message paused halfway (the client does not read its answers) resumes on a worker; a
// non-blocking message must not be handled on the reaction while that task is queued or
// running, or it would overtake the requests left of the paused one.
TEST(StreamFlowRouteTest, AnInlineMessageNeverOvertakesAQueuedWorkerTask) {
  StreamFlow f;
  f.Start();
  f.ReadDone(true);
  ASSERT_EQ(f.RouteMessage(1, false), Route::kWorker);
  f.WorkerTaskPosted();  // handles the message's requests
  EXPECT_EQ(f.RouteMessage(1, true), Route::kWorker);
  f.AnswerQueued();
  f.WriteStarted();
  ASSERT_EQ(f.SliceDone(/*more=*/true, /*queue_full=*/true), AfterSlice::kPause);
  EXPECT_EQ(f.WorkerTaskDone(), 0);  // the task returned, the rest of its message waits
  EXPECT_FALSE(f.WriteDone(true));
  ASSERT_TRUE(f.ResumeAfterWrite(true));
  f.WorkerTaskPosted();  // the rest of the paused message
  EXPECT_EQ(f.worker_tasks(), 1);
  EXPECT_EQ(f.RouteMessage(1, true), Route::kWorker);
  ASSERT_EQ(f.SliceDone(false, false), AfterSlice::kStartRead);
  EXPECT_EQ(f.RouteMessage(1, true), Route::kWorker);  // its task has not returned yet
  EXPECT_EQ(f.WorkerTaskDone(), 0);
  f.ReadDone(true);
  EXPECT_EQ(f.RouteMessage(1, true), Route::kInline);
}

}  // namespace
}  // namespace offloadd::rpc
