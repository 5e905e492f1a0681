# How vpce's tests run under MPI (unit tests, examples, the tool's tests): one place for the mpiexec command
# line, the rank counts and the environment. Included by the top-level CMakeLists.txt after find_package(MPI).
# Modelled on Cabana's cmake/test_harness/test_harness.cmake (one function adds a test at every rank count).

# mpiexec's flags before the executable: OpenMPI needs --oversubscribe for more ranks than cores; MPICH's mpiexec
# refuses that flag and oversubscribes without it.
set(VPCE_TEST_MPIEXEC_PREFLAGS ${MPIEXEC_PREFLAGS})
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _vpce_mpiexec_version ERROR_QUIET)
if(_vpce_mpiexec_version MATCHES "Open MPI|OpenRTE" AND NOT VPCE_TEST_MPIEXEC_PREFLAGS MATCHES "oversubscribe")
  list(APPEND VPCE_TEST_MPIEXEC_PREFLAGS --oversubscribe)
endif()

# Where each test's OpenMPI session directories go: OpenMPI 4 creates its session directory tree
# (<tmp>/ompi.<host>.<uid>/...) with a race between two mpiexec starting at once ("A call to mkdir was unable
# to create the desired directory ... File exists", open-mpi/ompi#8510): seen when CTest started two MPI
# tests together on a fresh machine. Each test gets its own base directory, short (a hash of the build folder
# and of the test's name) because PMIx's sockets live below it and a socket path has at most 107 bytes.
if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
  set(_vpce_tmp "$ENV{TMPDIR}")
else()
  set(_vpce_tmp /tmp)
endif()
string(SHA1 _vpce_build_hash "${PROJECT_BINARY_DIR}")
string(SUBSTRING "${_vpce_build_hash}" 0 8 _vpce_build_hash)
set(VPCE_TEST_MPI_SESSION_ROOT "${_vpce_tmp}/vpce-${_vpce_build_hash}")

# vpce_mpi_test_environment(<out-var> TEST <name> [THREADS <n>])
#
# The environment of every test that starts MPI (also those that are not vpce_add_mpi_test's, e.g. the install
# test and the fuzzer, whose programs call MPI_Init as singletons): OpenMPI refuses to run as root without the
# first two (MPICH ignores them); idle ranks yield their core (the CI machine has 2 cores and the tests run up
# to 4 ranks); the test's own OpenMPI session directory (above); no OpenMP thread pinning (ranks share cores);
# <n> OpenMP threads per rank (default 1).
function(vpce_mpi_test_environment out)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "THREADS;TEST" "")
  if(NOT arg_TEST)
    message(FATAL_ERROR "vpce_mpi_test_environment: TEST <name> is required")
  endif()
  if(NOT DEFINED arg_THREADS)
    set(arg_THREADS 1)
  endif()
  string(SHA1 test_hash "${arg_TEST}")
  string(SUBSTRING "${test_hash}" 0 8 test_hash)
  set(${out}
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_mpi_yield_when_idle=1
    OMPI_MCA_orte_tmpdir_base=${VPCE_TEST_MPI_SESSION_ROOT}/${test_hash}
    OMP_PROC_BIND=false
    OMP_NUM_THREADS=${arg_THREADS}
    PARENT_SCOPE)
endfunction()

# vpce_add_mpi_test(NAME <name> (TARGET <target> | COMMAND <command>...) RANKS <n>...
#                   [ARGS <arg>...] [THREADS <n>] [ENVIRONMENT <VAR=value>...] [LABELS <label>...]
#                   [TIMEOUT <seconds>] [PROPERTIES <property> <value>...])
#
# Adds one CTest test per rank count in RANKS, named <name>_np<n>, or <name> with @NP@ replaced by <n> when it
# contains @NP@. In COMMAND, ARGS, ENVIRONMENT and PROPERTIES too, @NP@ stands for the rank count.
#   TARGET       runs `mpiexec -n <n> <VPCE_TEST_MPIEXEC_PREFLAGS> $<TARGET_FILE:target> <MPIEXEC_POSTFLAGS> ARGS`.
#   COMMAND      a driver that starts mpiexec itself (e.g. a Python script given --np @NP@): run as given,
#                followed by ARGS, not under mpiexec.
#   THREADS      OpenMP threads per rank (OMP_NUM_THREADS; default 1).
#   ENVIRONMENT  added to vpce_mpi_test_environment's.
#   LABELS       added to the label "mpi" that every such test has.
#   TIMEOUT      seconds (default: CTest's).
#   PROPERTIES   any other test properties (FIXTURES_SETUP, RUN_SERIAL, ...), set last: they may override
#                PROCESSORS, which is the rank count times THREADS by default.
function(vpce_add_mpi_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;TARGET;THREADS;TIMEOUT"
                        "COMMAND;RANKS;ARGS;ENVIRONMENT;LABELS;PROPERTIES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "vpce_add_mpi_test: unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_NAME OR NOT arg_RANKS)
    message(FATAL_ERROR "vpce_add_mpi_test: NAME and RANKS are required")
  endif()
  if((arg_TARGET AND arg_COMMAND) OR (NOT arg_TARGET AND NOT arg_COMMAND))
    message(FATAL_ERROR "vpce_add_mpi_test(${arg_NAME}): give one of TARGET and COMMAND")
  endif()
  if(NOT DEFINED arg_THREADS)
    set(arg_THREADS 1)
  endif()
  set(labels mpi ${arg_LABELS})
  list(REMOVE_DUPLICATES labels)

  foreach(np IN LISTS arg_RANKS)
    if(arg_NAME MATCHES "@NP@")
      string(REPLACE "@NP@" "${np}" name "${arg_NAME}")
    else()
      set(name "${arg_NAME}_np${np}")
    endif()
    if(arg_TARGET)
      set(command ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${VPCE_TEST_MPIEXEC_PREFLAGS}
                  $<TARGET_FILE:${arg_TARGET}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
    else()
      set(command ${arg_COMMAND} ${arg_ARGS})
    endif()
    vpce_mpi_test_environment(env TEST ${name} THREADS ${arg_THREADS})
    list(APPEND env ${arg_ENVIRONMENT})
    string(REPLACE "@NP@" "${np}" command "${command}")
    string(REPLACE "@NP@" "${np}" np_env "${env}")
    string(REPLACE "@NP@" "${np}" np_properties "${arg_PROPERTIES}")

    add_test(NAME ${name} COMMAND ${command})
    # PROCESSORS: every rank's OpenMP threads. libgomp's threads spin at each barrier before they sleep, so two
    # tests of 2 threads each on 2 cores ran 4-5x slower than one after the other (Debug, MPICH's -j 2: 6 s
    # alone, 29 s beside another); once two such tests ran past their 600 s timeout in CI.
    math(EXPR processors "${np} * ${arg_THREADS}")
    set_tests_properties(${name} PROPERTIES PROCESSORS ${processors} LABELS "${labels}" ENVIRONMENT "${np_env}")
    if(DEFINED arg_TIMEOUT)
      set_tests_properties(${name} PROPERTIES TIMEOUT ${arg_TIMEOUT})
    endif()
    if(np_properties)
      set_tests_properties(${name} PROPERTIES ${np_properties})
    endif()
  endforeach()
endfunction()
