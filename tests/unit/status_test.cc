// Status and Result carry every operating error, and their one-line text is what a user reads
// in a refusal (the CLI prints it with the file and place). These hold that text and the
// value / error split.
#include "src/core/status.h"

#include <gtest/gtest.h>

#include <string>

namespace kvtwin {
namespace {

TEST(Status, OkReadsOkAndAnErrorItsCodeAndMessage) {
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
  const Status full = ResourceExhausted("cache full");
  EXPECT_FALSE(full.ok());
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), "cache full");
  EXPECT_EQ(full.ToString(),
            std::string(StatusCodeName(StatusCode::kResourceExhausted)) + ": cache full");
  EXPECT_EQ(InvalidArgument("x"), InvalidArgument("x"));
  EXPECT_FALSE(InvalidArgument("x") == Unsupported("x"));
}

Result<int> Half(int n) {
  if (n % 2 != 0) return InvalidArgument(std::to_string(n) + " is odd");
  return n / 2;
}

Status HalfTwice(int n, int* out) {
  Result<int> once = Half(n);
  if (!once.ok()) return once.status();
  Result<int> twice = Half(*once);
  KV_RETURN_IF_ERROR(twice.status());
  *out = *twice;
  return Status::Ok();
}

TEST(Result, HoldsAValueOrTheErrorThatStoppedIt) {
  int out = 0;
  EXPECT_TRUE(HalfTwice(12, &out).ok());
  EXPECT_EQ(out, 3);
  EXPECT_EQ(HalfTwice(6, &out).ToString(), InvalidArgument("3 is odd").ToString());
  EXPECT_EQ(out, 3);  // left as it was
}

TEST(ResultDeathTest, AValueOfAnErrorOrAnErrorWithoutOneAborts) {
  EXPECT_DEATH(static_cast<void>(Half(1).value()), "1 is odd");
  EXPECT_DEATH(static_cast<void>(Result<int>(Status::Ok())), "carries no value");
}

}  // namespace
}  // namespace kvtwin
