// parse_printed and printed_tolerance: what the digits of a printed number promise.
#include "kvcheck/golden/printed.hpp"

#include <gtest/gtest.h>

namespace {

using kvc::golden::FormatError;
using kvc::golden::parse_printed;
using kvc::golden::printed_tolerance;

TEST(Printed, ReadsDecimalsAsPrinted) {
    EXPECT_EQ(parse_printed("0.47").decimals, 2);
    EXPECT_EQ(parse_printed("0.00").decimals, 2);
    EXPECT_EQ(parse_printed("735.0").decimals, 1);
    EXPECT_EQ(parse_printed("1471").decimals, 0);
    EXPECT_EQ(parse_printed("1471").value, 1471.0L);
    EXPECT_EQ(parse_printed("735.5").value, 735.5L);
}

TEST(Printed, AcceptsThousandsCommasAndApproximationMarks) {
    EXPECT_EQ(parse_printed("5,049").value, 5049.0L);
    EXPECT_EQ(parse_printed("4,294,967,296").value, 4294967296.0L);
    EXPECT_EQ(parse_printed("~50").value, 50.0L);
    EXPECT_EQ(parse_printed("\xE2\x89\x88" "0.54").value, 0.54L);
    EXPECT_EQ(parse_printed("-2").value, -2.0L);
}

TEST(Printed, RejectsWhatIsNotANumber) {
    for (const char* bad : {"", "~", "4k", "2.5 GB", "1,23", "12,3456", ",123", "1.", ".5", "1..2", "0x10", "1e3", "mat"})
        EXPECT_THROW(parse_printed(bad), FormatError) << bad;
}

TEST(Printed, ToleranceIsHalfAUnitInTheLastDigitOrZeroWhenExact) {
    EXPECT_DOUBLE_EQ(static_cast<double>(printed_tolerance(2, false)), 0.005);
    EXPECT_DOUBLE_EQ(static_cast<double>(printed_tolerance(1, false)), 0.05);
    EXPECT_DOUBLE_EQ(static_cast<double>(printed_tolerance(0, false)), 0.5);
    EXPECT_EQ(printed_tolerance(0, true), 0.0L);
    EXPECT_EQ(printed_tolerance(1, true), 0.0L);
}

} // namespace
